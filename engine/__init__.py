"""spectune's engine: decoding, measurement, theory and recommendation. Never imports Streamlit."""

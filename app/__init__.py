"""spectune's Streamlit dashboard. It only queues sessions and reads the store; the worker decodes."""

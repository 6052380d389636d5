"""Start the dashboard: ``python -m app.serve [streamlit run's options]`` (what ``make dashboard`` runs).

Streamlit runs a page's script in the server process on a browser's first visit, so whatever that script imports
first (pandas, Altair, the app's modules, and torch through the hardware banner: about 2 s on a 2-core CPU) is
paid by the first page a user opens. Importing it here, before the server listens, moves that cost to start-up.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from pathlib import Path

HOME = Path(__file__).resolve().parent / "Home.py"


WARM = (
    *("pandas", "altair", "app.charts", "app.components", "app.data", "app.prompt_upload", "app.recommend_view"),
    *("app.run_view", "app.endpoints_view", "app.policies_view", "app.sessions_view", "app.theory_tables"),
)


def warm() -> float:
    """Import what every page's first run needs and describe the hardware once; the seconds it took."""
    t0 = time.perf_counter()
    import streamlit  # noqa: F401 - first: its loggers take its level when they are made

    checks = logging.getLogger("streamlit.runtime.caching.cache_data_api")  # st.cache_data checks its arguments
    level = checks.level  # at import and says "No runtime found" outside the server; it caches inside it
    checks.setLevel(logging.ERROR)
    try:
        for name in WARM:
            importlib.import_module(name)
        from app import common

        common.hardware()
    except Exception as exc:  # noqa: BLE001 - the page that needs it shows the error; the dashboard still starts
        print(f">> warming the dashboard failed ({type(exc).__name__}: {exc}); pages will import on first visit")
    finally:
        checks.setLevel(level)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(f">> dashboard modules and hardware ready in {warm():.1f} s", flush=True)
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(HOME), *args]
    return int(cli.main() or 0)


if __name__ == "__main__":
    sys.exit(main())

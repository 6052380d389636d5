"""The dashboard launcher (app/serve.py): what a page's first run imports is imported before the server listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "altair", "numpy", "app", "engine")

FIRST_RUNS = """
import json, sys
from app import serve
serve.warm()
before = set(sys.modules)
from streamlit.testing.v1 import AppTest
for page in [None, *sorted(p.name for p in serve.HOME.parent.joinpath("pages").glob("*.py"))]:
    at = AppTest.from_file(str(serve.HOME), default_timeout=60)
    if page:
        at.switch_page(f"pages/{page}")
    at.run()
    assert not at.exception, (page, [e.value for e in at.exception])
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in HEAVY)
print(json.dumps(new))
"""


def test_every_pages_first_run_finds_its_heavy_imports_done(tmp_path: Path) -> None:
    env = dict(os.environ, SPECTUNE_HOME=str(tmp_path))
    env.pop("SPECTUNE_DB_URL", None)
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{FIRST_RUNS}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    new = json.loads(done.stdout.strip().splitlines()[-1])
    heavy = [m for m in new if m.split(".")[0] in ("torch", "pandas", "altair")]
    assert heavy == [], f"a page's first run imported {heavy[:8]}: add them to app.serve.warm"
    assert len([m for m in new if m.startswith(("app.", "engine."))]) <= 40, new

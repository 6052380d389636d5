"""PostgreSQL-only store tests: a worker running a whole session against a real PostgreSQL server.

Everything else about the store (migrations, the session queue and its claim races across separate engines
and processes, step logging, the dashboard's readers, cascades) runs on PostgreSQL as well as on SQLite
through the parametrised `store` / `store_url` fixtures in tests/conftest.py: see test_store_schema.py,
test_store_sessions.py and test_store_steps.py, whose tests run as test_x[sqlite] and test_x[postgresql].
The SQLite worker end to end lives in tests/test_worker.py.

The server is SPECTUNE_TEST_PG_URL, which `make test` starts (scripts/start_postgres.sh); without it these
tests fail. Each test gets its own empty database, dropped afterwards. By hand:

    url="$(scripts/start_postgres.sh)"; SPECTUNE_TEST_PG_URL="$url" .venv/bin/python -m pytest tests/test_store_*.py
    scripts/stop_postgres.sh
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the project is not installed; let `pytest tests/...` import it from any cwd
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from store import Store  # noqa: E402

pytestmark = pytest.mark.postgresql_only


def count(store: Store, table: str, where: str = "1=1") -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one())


def assert_plain_numbers(rows: list[dict[str, Any]]) -> None:
    """Readers hand the dashboard int/float/None, never Decimal (PostgreSQL's avg() of integers is numeric)."""
    for row in rows:
        for key, value in row.items():
            assert value is None or type(value) in (int, float, str, dict), (key, type(value))


# --- a worker, end to end, on the tiny models -----------------------------------------------------


def test_worker_runs_a_session_end_to_end(store: Store) -> None:
    assert store.engine.dialect.name == "postgresql"
    import torch

    from engine.service.jobs import submit_session
    from engine.service.worker.loop import serve
    from engine.session.spec import SessionSpec

    target, draft = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"
    texts = [{"text": f"p prompt {i}: write a short story about the number {i}."} for i in range(3)]
    set_id, _, _ = store.add_prompt_set("pg-e2e", None, texts)
    settings = SessionSpec(
        target=target, drafts=[draft, "ngram"], gammas=[1, 2], max_new_tokens=32, dtype="float32", detect_regime=False
    )
    sid = submit_session(store, settings, set_id, 3, "pg")
    assert (store.get_session(sid) or {})["status"] == "queued"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread hand-off would cost more than the work
    try:
        assert serve(store, once=True) == 1
    finally:
        torch.set_num_threads(threads)

    session = store.get_session(sid) or {}
    assert session["status"] == "done", session["error"]
    assert session["progress_total"] == 3 * (1 + 2 * 2 + 1) == session["progress_done"]  # and the A/A decode
    runs = store.list_runs(sid)
    assert [(r["kind"], r["draft"], r["gamma"]) for r in runs] == [
        ("baseline", "none", 0),
        ("speculative", draft, 1),
        ("speculative", draft, 2),
        ("speculative", "ngram", 1),
        ("speculative", "ngram", 2),
    ]
    for run in runs:
        assert run["status"] == "done"
        outputs = store.get_outputs(run["id"])
        assert [o["prompt_index"] for o in outputs] == [0, 1, 2]
        logged = store.run_progress(run["id"])["steps"]
        assert logged == sum(o["steps"] for o in outputs) > 0
        assert run["summary"]["steps"] == logged
        if run["kind"] == "speculative":
            assert 0.0 <= run["alpha"] <= 1.0
            assert store.per_position_acceptance(run["id"])
            assert_plain_numbers(store.step_series(run["id"]))
    assert store.utilisation_series(sid)
    assert set(session["summary"]["verify_cost"]) >= {"1", "2", "3"}
    assert session["regime"] is None
    assert store.delete_session(sid) is True and count(store, "steps") == 0

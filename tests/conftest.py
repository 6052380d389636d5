"""Shared fixtures: tiny in-process model pairs (fast), the real bundled pair (loaded once), and the store on
SQLite and PostgreSQL (one fresh database per test)."""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("SPECTUNE_TEST_RUN", uuid.uuid4().hex)  # tests/processes.py: what this run started
# sessions asking for loop "auto" decode eagerly (a compile probe per test costs minutes); the loop tests set theirs
os.environ.setdefault("SPECTUNE_LOOP", "eager")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cpu_hog import cpu_hog, pytest_addoption  # noqa: E402, F401 - `pytest --cpu-hog N`: the suite beside a load

SHARED_DATA = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"


@pytest.fixture(scope="session")
def tiny_pair():
    """A tiny target and a noisy copy of it as draft: they agree often, not always."""
    from engine.models.tiny import load_tiny

    return load_tiny("tiny:1:48:2:64", logit_scale=4.0), load_tiny("tiny:1:48:2:64~0.15", logit_scale=4.0)


_REAL: dict[str, tuple] = {}


def real_pair(dtype: str):
    """The bundled Qwen2.5-Coder 1.5B target and 0.5B draft, loaded once per dtype per test run."""
    if dtype not in _REAL:
        from engine.models.pool import ModelPool

        pool = ModelPool()
        _REAL.clear()  # keep at most one dtype in memory (fp32 1.5B + 0.5B is ~8 GB)
        gc.collect()
        _REAL[dtype] = (pool.get("qwen2.5-coder-1.5b", dtype), pool.get("qwen2.5-coder-0.5b", dtype))
    return _REAL[dtype]


@functools.cache
def _real_pair_rank(path: Path) -> int:
    """0 for a module that never loads the real pair, 1 for one that loads it in bfloat16, 2 in float32 (each
    module's file read once)."""
    text = path.read_text(encoding="utf-8") if path.suffix == ".py" else ""
    if "real_pair(" not in text or path.name == "conftest.py":
        return 0
    return 1 if 'real_pair("bfloat16")' in text else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that load the bundled real pair (about 8 GB in float32) run last, bfloat16 first: the pair is
    loaded once per dtype and never held beside the rest of the suite's servers and browsers. Otherwise the
    collection order stands."""
    items[:] = sorted(items, key=lambda item: _real_pair_rank(item.path))


def _trim_heap() -> None:
    """Hand the freed heap back to the system (glibc's malloc_trim; nothing where the C library has none)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(autouse=True, scope="module")
def _release_module_memory():
    """What a test module loaded is freed when it ends, and the freed heap handed back to the system, so one
    module's models do not stay resident beside the next module's servers and browsers."""
    yield
    gc.collect()
    _trim_heap()


# prompts for the real-pair tests: code (high α) and prose (lower α)
REAL_PROMPTS = [
    "Write a Python function is_prime(n) that returns True when n is prime.",
    "Explain in two sentences what a hash map is.",
    "Complete this code:\ndef fizzbuzz(n):\n    for i in range(1, n + 1):",
]


def greedy_config(gamma: int, new_tokens: int, record: int = 0):
    """Greedy decoding of `new_tokens` tokens; `record` > 0 keeps the target's top logits (baselines)."""
    from engine.core.decoder import DecodeConfig
    from engine.core.sampling import SamplingConfig

    return DecodeConfig(gamma, SamplingConfig(0.0), new_tokens, record_top_logits=record)


# --- the store, once per database backend ----------------------------------------------------------
#
# Store tests ask for `store` (an open, migrated, empty Store) or `store_url` (the URL of a new, empty
# database) and run once on SQLite and once on PostgreSQL: test_x[sqlite], test_x[postgresql]. PostgreSQL is
# the server named by SPECTUNE_TEST_PG_URL, which `make test` starts (scripts/start_postgres.sh); without
# it the [postgresql] tests FAIL, they do not skip. Every test gets its own database: a file in tmp_path on
# SQLite, a fresh CREATE DATABASE on PostgreSQL, dropped again afterwards.
#
#   @pytest.mark.sqlite_only       SQLite-file behaviour (WAL, pragmas, read-only, corrupt files): [sqlite] only
#   @pytest.mark.postgresql_only   PostgreSQL-specific tests (tests/test_store_postgres.py): [postgresql] only

STORE_BACKENDS = ("sqlite", "postgresql")
PG_URL_VAR = "SPECTUNE_TEST_PG_URL"
_PG_HOWTO = (
    "`make test` starts one; by hand: url=$(scripts/start_postgres.sh); "
    f"{PG_URL_VAR}=$url .venv/bin/python -m pytest ...; scripts/stop_postgres.sh "
    "(or deselect them with -k 'not postgresql')"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: a store test of SQLite-file behaviour; runs on [sqlite] only")
    config.addinivalue_line("markers", "postgresql_only: a PostgreSQL-specific store test; runs on [postgresql] only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every test that (through `store` / `store_url`) needs `store_backend` over the backends."""
    if "store_backend" not in metafunc.fixturenames:
        return
    sqlite_only = metafunc.definition.get_closest_marker("sqlite_only") is not None
    postgresql_only = metafunc.definition.get_closest_marker("postgresql_only") is not None
    if sqlite_only and postgresql_only:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: marked both sqlite_only and postgresql_only")
    backends = ["sqlite"] if sqlite_only else ["postgresql"] if postgresql_only else list(STORE_BACKENDS)
    metafunc.parametrize("store_backend", backends)


@pytest.fixture(scope="session")
def _pg_server():
    """(server URL, AUTOCOMMIT engine on its `postgres` database) for the whole run; fails without a server."""
    raw = os.environ.get(PG_URL_VAR, "").strip()
    if not raw:
        pytest.fail(
            f"{PG_URL_VAR} is not set: the [postgresql] store tests need a PostgreSQL server. {_PG_HOWTO}",
            pytrace=False,
        )
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    server = make_url(raw)
    if server.get_backend_name() != "postgresql":
        pytest.fail(f"{PG_URL_VAR} must be a postgresql URL, not {server.get_backend_name()!r}", pytrace=False)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:  # any driver error: say which server and why, once
        admin.dispose()
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        pytest.fail(
            f"cannot reach PostgreSQL at {server.render_as_string(hide_password=True)} ({PG_URL_VAR}): "
            f"{type(exc).__name__}: {first_line}. {_PG_HOWTO}",
            pytrace=False,
        )
    yield server, admin
    admin.dispose()


@pytest.fixture
def store_url(store_backend: str, tmp_path: Path, request: pytest.FixtureRequest):
    """The URL of a new, empty database on `store_backend` (the store's tables are not created yet)."""
    if store_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    assert store_backend == "postgresql", store_backend
    import uuid

    server, admin = request.getfixturevalue("_pg_server")
    name = f"spectune_t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:  # WITH (FORCE): connections a test leaked do not keep it alive
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def store(store_url: str):
    """An open Store on a fresh database of `store_backend`, migrated to the newest schema."""
    from store import open_store

    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data directory: the database is $SPECTUNE_HOME/spectune.db (a test module may define its own)."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    return tmp_path


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for tiny models: on a shared 2-core box OpenMP's thread hand-off costs ~15 ms per tiny
    matmul, 1000x the matmul itself (restored afterwards). A module uses it with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Bad input, faults and load, with nothing lost: out of memory, a locked, read-only, corrupt or full
database, several workers, remote code, and session settings refused up front.

Real SQLite files in tmp_path (SPECTUNE_HOME points there), the real worker, tiny in-process models.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

from sqlalchemy import event, text  # noqa: E402

from engine.core.records import StepRecord  # noqa: E402
from engine.errors import SettingsError  # noqa: E402
from engine.service.jobs import submit_session  # noqa: E402
from engine.session.spec import SessionSpec, check_context, validate  # noqa: E402
from store import Store, StoreError  # noqa: E402
from tests.test_worker import DRAFT, DTYPE, TARGET, open_db, prompt_set, queue, step_count  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    s = open_db(home)
    yield s
    s.close()


SESSION_SETTINGS = {"target": "t", "drafts": ["ngram"], "gammas": [1], "temperatures": [0.0], "max_new_tokens": 8}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def a_step(i: int) -> StepRecord:
    return StepRecord(0, i, 2, 1, [True, False], [0.9, 0.2], 0.001, 0.002, 2, 2)


# --- out of memory --------------------------------------------------------------------------------------


def test_out_of_memory_loading_fails_that_session_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.engines.spectune.runner
    from engine.service.worker.loop import serve

    too_big = "tiny:2:48:2:64"
    real_get = engine.engines.spectune.runner.ModelPool.get

    def get(self: Any, ref: str, *args: Any, **kwargs: Any) -> Any:
        if ref == too_big:
            raise MemoryError()
        return real_get(self, ref, *args, **kwargs)

    monkeypatch.setattr(engine.engines.spectune.runner.ModelPool, "get", get)
    doomed = queue(store, target=too_big)
    fine = queue(store, prompts=3)
    assert serve(store, once=True) == 2

    failed = store.get_session(doomed)
    assert failed["status"] == "failed" and failed["error"].startswith("out of memory"), failed["error"]
    assert store.get_session(fine)["status"] == "done", store.get_session(fine)["error"]


def test_out_of_memory_mid_decode_keeps_the_steps_so_far(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA OOM (a RuntimeError subclass) in the second speculative run: every step delivered is stored."""
    import torch

    import engine.engines.spectune.runner
    from engine.service.worker.loop import serve

    real_decode = engine.engines.spectune.runner.decode_prompt
    real_run = engine.engines.spectune.runner.SpectuneRunner.decode
    delivered: dict[str, int] = {"steps": 0}
    boom = {"armed": True}
    logged = {"now": False}

    def run(self: Any, key: Any, index: int, ctx: Any, reference: bool) -> Any:
        logged["now"] = key.kind != "baseline" or reference  # the A/A decode (the target alone again) is not logged
        try:
            return real_run(self, key, index, ctx, reference)
        finally:
            logged["now"] = False

    def decode(target: Any, draft: Any, ids: Any, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        on_step = kwargs["on_step"]

        def counting(rec: StepRecord) -> None:
            on_step(rec)
            if logged["now"]:  # the warm-up and the prime decode outside a run
                delivered["steps"] += 1
            if boom["armed"] and cfg.gamma == 2 and rec.step_index == 5:
                boom["armed"] = False
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        return real_decode(target, draft, ids, cfg, *args, **(kwargs | {"on_step": counting}))

    monkeypatch.setattr(engine.engines.spectune.runner, "decode_prompt", decode)
    monkeypatch.setattr(engine.engines.spectune.runner.SpectuneRunner, "decode", run)
    doomed = queue(store, prompts=3, drafts=("ngram",), gammas=(1, 2), max_new_tokens=32)
    fine = queue(store, prompts=2)
    assert serve(store, once=True) == 2

    failed = store.get_session(doomed)
    assert failed["status"] == "failed" and failed["error"].startswith("out of memory"), failed["error"]
    assert step_count(store, doomed) == delivered["steps"] - step_count(store, fine) > 0
    # interleaved: every run is open when the error hits, so each is failed with what it logged kept
    assert [r["status"] for r in store.list_runs(doomed)] == ["failed", "failed", "failed"]
    assert store.get_session(fine)["status"] == "done"


# --- the database under stress --------------------------------------------------------------------------

LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
"""


def test_database_locked_by_another_process(home: Path) -> None:
    store = open_db(home, busy_timeout_s=0.3)
    try:
        set_id = prompt_set(store, 2)
        before = store.create_session(**SESSION_SETTINGS, prompt_set_id=set_id)
        run_id = store.create_run(before, "ngram", 2, 0.0, "speculative")
        writer = store.step_writer(run_id, batch_size=10_000, flush_interval_s=3600)

        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(home / "spectune.db")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert locker.stdout.readline().strip() == "locked"
            t0 = time.monotonic()
            with pytest.raises(StoreError) as caught:
                store.create_session(**SESSION_SETTINGS)
            waited = time.monotonic() - t0
            message = str(caught.value)
            assert "locked by another process" in message and str(home / "spectune.db") in message
            assert "\n" not in message
            assert 0.25 <= waited < 5, waited  # waited for the busy timeout, then gave up

            for i in range(10):
                writer.add(a_step(i))
            with pytest.raises(StoreError, match="locked"):
                writer.flush()
            assert writer.pending == 10  # a failed batch goes back to the buffer
            assert store.get_session(before)["status"] == "queued"  # readers are not blocked (WAL)
        finally:
            locker.communicate("release\n", timeout=10)
        assert locker.returncode == 0

        assert writer.flush() == 10  # nothing lost once the lock is released
        after = store.create_session(**SESSION_SETTINGS)
        assert store.run_progress(run_id)["steps"] == 10
        assert [s["id"] for s in store.list_sessions()] == [after, before]
    finally:
        store.close()


def test_read_only_database_refuses_writes_and_is_left_untouched(home: Path) -> None:
    path = home / "spectune.db"
    store = open_db(home)
    sid = store.create_session(**SESSION_SETTINGS)
    store.close()
    digest = sha256(path)
    path.chmod(0o444)  # tests run as root: the store checks the mode bits itself
    try:
        ro = open_db(home)
        try:
            assert ro.read_only
            assert ro.get_session(sid)["status"] == "queued"  # reading still works
            with pytest.raises(StoreError) as caught:
                ro.create_session(**SESSION_SETTINGS)
            assert "read-only" in str(caught.value) and str(path) in str(caught.value)
            with pytest.raises(StoreError, match="read-only"):
                ro.request_cancel(sid)
        finally:
            ro.close()
    finally:
        path.chmod(0o644)
    assert sha256(path) == digest


@pytest.mark.parametrize("damage", ["not a database", "damaged first page"])
def test_corrupt_database_is_refused_and_never_overwritten(home: Path, damage: str) -> None:
    path = home / "spectune.db"
    if damage == "not a database":
        path.write_bytes(b"these are my notes, not a database\n" * 200)
    else:
        store = open_db(home)
        store.create_session(**SESSION_SETTINGS)
        store.close()
        data = bytearray(path.read_bytes())
        data[100:4096] = bytes((i * 37 + 11) % 256 for i in range(3996))  # keep the header, wreck the schema
        path.write_bytes(bytes(data))
    digest = sha256(path)
    with pytest.raises(StoreError) as caught:
        open_db(home)
    message = str(caught.value)
    assert "not a SQLite database or is corrupt" in message and str(path) in message
    assert "\n" not in message
    assert sha256(path) == digest


def test_disk_full_while_logging_fails_the_session_cleanly(home: Path, store: Store) -> None:
    """The database is capped with PRAGMA max_page_count (same SQLITE_FULL as a full disk, no mount needed)."""
    from engine.service.worker.loop import serve

    sid = queue(store, prompts=6, drafts=("ngram",), gammas=(1,), max_new_tokens=400)
    with store.engine.connect() as conn:
        pages = int(conn.execute(text("PRAGMA page_count")).scalar_one())
    store.engine.dispose()  # every connection from now on gets the cap

    def cap(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 30}")  # ~120 KB more: the baseline fits, not more

    event.listen(store.engine, "connect", cap)
    try:
        assert serve(store, once=True) == 1  # the worker survives the full disk
    finally:
        event.remove(store.engine, "connect", cap)
        store.engine.dispose()

    session = store.get_session(sid)
    assert session["status"] == "failed"
    assert "database or disk is full" in session["error"], session["error"]
    runs = store.list_runs(sid)
    assert [r["status"] for r in runs][-1] == "failed" and "running" not in [r["status"] for r in runs]

    reopened = open_db(home)  # what was committed is still there and readable
    try:
        with reopened.engine.connect() as conn:
            assert conn.execute(text("PRAGMA integrity_check")).scalar_one() == "ok"
        assert reopened.get_session(sid)["status"] == "failed"
        # interleaved runs are all open when the disk fills: each is failed, keeping the batches committed
        # before the cap was hit (whether any fit depends on page boundaries, so a run may have kept none)
        assert all(r["status"] == "failed" for r in runs)
        assert step_count(reopened, sid) == sum(reopened.run_progress(r["id"])["steps"] for r in runs)
        assert all(len(reopened.get_outputs(r["id"])) < 6 for r in runs)
        nxt = queue(reopened, prompts=2)  # with room again, the next session runs
        serve(reopened, once=True)
        assert reopened.get_session(nxt)["status"] == "done"
    finally:
        reopened.close()


def test_two_workers_at_once_is_covered_in_test_worker() -> None:
    """Two `python -m engine worker --once` processes on three queued sessions: see
    tests/test_worker.py::test_two_workers_run_each_session_exactly_once (each session runs exactly once)."""
    import tests.test_worker as tw

    assert callable(tw.test_two_workers_run_each_session_exactly_once)


def test_a_slow_model_load_is_not_mistaken_for_a_dead_worker(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No decode steps run while a model loads (a GGUF conversion takes a minute); the heartbeat must go on,
    or a second worker's orphan check fails the healthy session."""
    import engine.engines.spectune.runner
    import engine.service.worker.store_hooks
    from tests.test_worker import serve_in_thread, wait_for

    monkeypatch.setattr(engine.service.worker.store_hooks, "HEARTBEAT_S", 0.1)
    real_get = engine.engines.spectune.runner.ModelPool.get

    def slow_get(self: Any, ref: str, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)
        return real_get(self, ref, *args, **kwargs)

    monkeypatch.setattr(engine.engines.spectune.runner.ModelPool, "get", slow_get)
    watcher = open_db(home)
    try:
        sid = queue(watcher, prompts=1, max_new_tokens=8)
        thread, result = serve_in_thread(home)
        wait_for(lambda: watcher.get_session(sid)["status"] == "running", 30, "the claim")
        time.sleep(0.8)  # well inside the load
        assert watcher.interrupt_orphaned_sessions(stale_after_s=0.5) == []  # what another worker would do
        thread.join(60)
        assert "error" not in result, result.get("error")
        assert watcher.get_session(sid)["status"] == "done", watcher.get_session(sid)["error"]
    finally:
        watcher.close()


# --- remote code stays off ------------------------------------------------------------------------------


def test_trust_remote_code_is_off_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    import engine.models.pool
    from engine.errors import ModelError
    from engine.models.loading import load_model
    from engine.service.cli.main import build_parser

    model_dir = tmp_path / "local-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2", "auto_map": {"AutoModel": "x.Y"}}))
    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_tokenizer(location: str, **kwargs: Any) -> object:
        calls.append(("tokenizer", kwargs))
        return object()

    def fake_model(location: str, **kwargs: Any) -> object:
        calls.append(("model", kwargs))
        raise OSError("stop here: the arguments are what this test wants")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)

    with pytest.raises(ModelError):
        load_model(str(model_dir), dtype="float32", device="cpu")
    assert [(who, kw["trust_remote_code"]) for who, kw in calls] == [("tokenizer", False), ("model", False)]

    calls.clear()
    with pytest.raises(ModelError):
        load_model(str(model_dir), dtype="float32", device="cpu", trust_remote_code=True)
    assert [kw["trust_remote_code"] for _, kw in calls] == [True, True]

    # The worker's path: ModelPool.get without the flag passes False down to load_model.
    seen: list[bool] = []
    monkeypatch.setattr(
        engine.models.pool, "load_model", lambda ref, dtype, device, trust_remote_code: seen.append(trust_remote_code)
    )
    engine.models.pool.ModelPool().get(str(model_dir), "float32")
    assert seen == [False]

    # Defaults everywhere a session is born: settings, a stored session's options, the CLI.
    assert SessionSpec(target="t", drafts=["ngram"], gammas=[1]).trust_remote_code is False
    assert SessionSpec.from_row({**SESSION_SETTINGS, "options": {}}).trust_remote_code is False
    args = build_parser().parse_args(["submit", "--prompts", "p.txt"])
    assert args.trust_remote_code is False
    assert build_parser().parse_args(["submit", "--prompts", "p.txt", "--trust-remote-code"]).trust_remote_code


def test_submit_stores_trust_remote_code_off_by_default(store: Store) -> None:
    sid = queue(store)
    session = store.get_session(sid)
    assert session["options"]["trust_remote_code"] is False
    assert SessionSpec.from_row(session).trust_remote_code is False


# --- settings refused up front --------------------------------------------------------------------------


def _settings(**changes: Any) -> SessionSpec:
    base = {"target": TARGET, "drafts": [DRAFT], "gammas": [2], "max_new_tokens": 16, "dtype": DTYPE}
    return SessionSpec(**(base | changes))


REFUSED = {
    "gamma 0": ({"gammas": [0]}, "γ = 0 is out of range"),
    "gamma negative": ({"gammas": [-3]}, "γ = -3 is out of range"),
    "gamma 1000": ({"gammas": [1000]}, "γ = 1000 is out of range: at most 64"),
    "temperature negative": ({"temperatures": [-0.5]}, "temperature -0.5 is negative"),
    "max new tokens 0": ({"max_new_tokens": 0}, "max new tokens = 0: must be at least 1"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_settings_are_refused_with_a_clear_message(store: Store, case: str) -> None:
    changes, expected = REFUSED[case]
    with pytest.raises(SettingsError) as caught:
        validate(_settings(**changes))
    assert expected in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        submit_session(store, _settings(**changes), prompt_set(store, 2), 2)
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert store.list_sessions() == []


def test_max_new_tokens_beyond_the_context_is_refused(store: Store) -> None:
    with pytest.raises(SettingsError, match="beyond the model context of 4096 tokens"):
        check_context(12, 5000, 4096, "prompt 1")
    with pytest.raises(SettingsError, match="prompt 7: 100 prompt tokens \\+ 4000 new tokens exceed"):
        check_context(100, 4000, 4096, "prompt 7")
    check_context(96, 4000, 4096, "prompt 7")  # exactly fits

    # Refused before it is queued: the target's config and tokenizer say its context, no weights are loaded.
    with pytest.raises(SettingsError, match="max new tokens = 5000 is beyond the model context of 4096 tokens"):
        queue(store, max_new_tokens=5000)
    assert store.list_sessions() == []

    # One stored without that check (an older queue, a target whose config is not at hand) fails in the worker.
    from engine.service.worker.loop import serve

    settings = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[1], max_new_tokens=5000, dtype=DTYPE)
    sid = store.create_session(**settings.to_row(), prompt_set_id=prompt_set(store, 2), n_prompts=2)
    serve(store, once=True)
    session = store.get_session(sid)
    assert session["status"] == "failed"
    assert "max new tokens = 5000 is beyond the model context of 4096 tokens" in session["error"]


def test_empty_prompt_set_is_refused(store: Store) -> None:
    with pytest.raises(SettingsError, match="the prompt set is empty"):
        validate(_settings(), 0)
    with pytest.raises(StoreError, match="has no prompts"):
        store.add_prompt_set("empty", "empty.txt", [])
    with pytest.raises(SettingsError, match="number of prompts = 0"):
        submit_session(store, _settings(), prompt_set(store, 2), 0)
    with pytest.raises(SettingsError, match="prompt set 999 does not exist"):
        submit_session(store, _settings(), 999, 1)
    assert store.list_sessions() == []

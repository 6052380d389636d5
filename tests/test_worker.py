"""The decoding worker end to end: real SQLite files, real worker processes, tiny in-process models.

Every test points SPECTUNE_HOME at its own tmp_path. In-process tests call engine.service.worker.loop.serve(); the
crash, concurrency and CLI tests start `python -m engine worker` / `submit` / ... as subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

from sqlalchemy import text  # noqa: E402

from engine.service.jobs import submit_session  # noqa: E402
from engine.session.spec import SessionSpec  # noqa: E402
from store import Store, open_store  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"  # a noisy copy of the target: agrees often, not always
DTYPE = "float32"


# --- helpers (tests/test_reliability.py imports these) -------------------------------------------------


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    s = open_db(home)
    yield s
    s.close()


def db_url(home: Path) -> str:
    return f"sqlite:///{home / 'spectune.db'}"


def open_db(home: Path, **kwargs: Any) -> Store:
    return open_store(db_url(home), **kwargs)


def prompt_set(store: Store, n: int, tag: str = "p") -> int:
    texts = [{"text": f"{tag} prompt {i}: write a short story about the number {i}."} for i in range(n)]
    set_id, _, _ = store.add_prompt_set(f"{tag}-{n}", None, texts)
    return set_id


def queue(
    store: Store,
    *,
    prompts: int = 2,
    drafts: tuple[str, ...] = ("ngram",),
    gammas: tuple[int, ...] = (1,),
    max_new_tokens: int = 16,
    detect_regime: bool = False,
    target: str = TARGET,
    name: str | None = None,
) -> int:
    settings = SessionSpec(
        target=target,
        drafts=list(drafts),
        gammas=list(gammas),
        max_new_tokens=max_new_tokens,
        dtype=DTYPE,
        detect_regime=detect_regime,
    )
    return submit_session(store, settings, prompt_set(store, prompts), prompts, name)


def queue_long(store: Store, prompts: int = 6) -> int:
    """Several seconds of decoding (baseline ~2 ms a step × ~1700 steps, then the draft)."""
    return queue(store, prompts=prompts, drafts=(DRAFT,), gammas=(1,), max_new_tokens=400, name="long")


def step_count(store: Store, session_id: int) -> int:
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM steps JOIN runs ON runs.id = steps.run_id WHERE runs.session_id = :s"),
                {"s": session_id},
            ).scalar_one()
        )


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def engine_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPECTUNE_DB_URL", None)
    env.update(SPECTUNE_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start_worker(home: Path, *args: str, log_name: str = "worker.out") -> subprocess.Popen:
    with open(home / log_name, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "engine", "worker", *args],
            cwd=ROOT,
            env=engine_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def engine_cli(home: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        cwd=ROOT,
        env=engine_env(home),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def worker_log(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(home.glob("*.out")))


def serve_in_thread(home: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """engine.service.worker.loop.serve(once=True) on its own Store in a background thread."""
    from engine.service.worker.loop import serve

    result: dict[str, Any] = {}

    def target() -> None:
        worker_store = open_db(home)
        try:
            result["ran"] = serve(worker_store, once=True, poll_s=0.05)
        except BaseException as exc:  # surfaced by the test
            result["error"] = exc
        finally:
            worker_store.close()

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    return thread, result


# --- a session, in process ----------------------------------------------------------------------------


def test_queued_session_runs_to_done(store: Store) -> None:
    from engine.service.worker.loop import serve

    sid = queue(store, prompts=4, drafts=(DRAFT, "ngram"), gammas=(1, 2), max_new_tokens=64)
    assert store.get_session(sid)["status"] == "queued"
    assert serve(store, once=True) == 1

    session = store.get_session(sid)
    assert session["status"] == "done", session["error"]
    assert session["error"] is None and session["finished_at"] is not None
    assert session["progress_total"] == 4 * (1 + 2 * 2 + 1)  # the baseline, 2 drafts × 2 γ and the A/A
    assert session["progress_done"] == session["progress_total"]

    runs = store.list_runs(sid)
    keys = [(r["kind"], r["draft"], r["gamma"]) for r in runs]
    assert keys == [
        ("baseline", "none", 0),
        ("speculative", DRAFT, 1),
        ("speculative", DRAFT, 2),
        ("speculative", "ngram", 1),
        ("speculative", "ngram", 2),
    ]
    total_steps = 0
    for run in runs:
        assert run["status"] == "done"
        outputs = store.get_outputs(run["id"])
        assert [o["prompt_index"] for o in outputs] == [0, 1, 2, 3]
        logged = store.run_progress(run["id"])["steps"]
        assert logged == sum(o["steps"] for o in outputs) > 0  # every verification step is in the log
        assert run["summary"]["steps"] == logged
        total_steps += logged
        for out in outputs:
            assert out["token_ids"] and len(out["from_draft"]) == len(out["token_ids"])
            if run["kind"] == "baseline":
                assert out["divergence"] is None
            else:
                assert out["divergence"]["verdict"] in ("identical", "fp-tie", "divergent")
        if run["kind"] == "speculative":
            assert run["alpha"] is not None and 0.0 <= run["alpha"] <= 1.0
    assert step_count(store, sid) == total_steps

    samples = store.utilisation_series(sid)
    assert samples, "no utilisation samples were stored"
    from engine.measure.telemetry import nvml_available

    expected = "nvml" if nvml_available() else "cpu"  # "cpu" on a machine without an NVIDIA driver
    assert {s["source"] for s in samples} == {expected}
    assert all(s["metrics"] for s in samples)
    assert any(s["run_id"] is not None for s in samples)  # attached to the run being logged

    summary = session["summary"]
    assert set(summary["verify_cost"]) >= {"1", "2", "3"}
    assert summary["hardware"]
    assert len(summary["runs"]) == 4
    assert session["regime"] is None  # detect_regime was off


def test_regime_is_detected_when_asked(store: Store) -> None:
    from engine.service.worker.loop import serve

    sid = queue(store, prompts=2, drafts=("ngram",), gammas=(1, 2), max_new_tokens=16, detect_regime=True)
    serve(store, once=True)
    session = store.get_session(sid)
    assert session["status"] == "done", session["error"]
    regime = session["regime"]
    assert regime and regime["label"]
    assert regime["batch_sweep"]["batch_sizes"] and len(regime["batch_sweep"]["step_times_s"]) == len(
        regime["batch_sweep"]["batch_sizes"]
    )
    assert regime["label"] in ("memory-bound", "compute-bound")
    assert set(regime["votes"]) == {"batch sweep", "verify curve", "roofline"}
    roof = regime["roofline"]
    assert roof["achieved_bandwidth"] > 0 and roof["achieved_flops"] > 0
    assert 0 < roof["bandwidth_fraction"] and 0 < roof["flops_fraction"]
    assert any(e.startswith("roofline:") for e in regime["evidence"])
    from engine.measure.telemetry import nvml_available

    if not nvml_available():
        assert regime["nvml"] is None  # no GPU: the cross-check is skipped, not faked


def test_worker_keeps_models_loaded_between_sessions(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.models.pool
    import engine.service.worker.loop

    loads: list[str] = []
    real_load = engine.models.pool.load_tiny

    def counting_load(ref: str, *args: Any, **kwargs: Any) -> Any:
        loads.append(ref)
        return real_load(ref, *args, **kwargs)

    monkeypatch.setattr(engine.models.pool, "load_tiny", counting_load)
    seen: list[tuple[int, dict[tuple, int], int]] = []  # (pool id, {key: model id}, loads so far) per session
    real_run_session = engine.service.worker.loop.run_session

    def recording_run_session(store_: Any, session: dict, pool: Any, worker_id: str) -> str:
        state = real_run_session(store_, session, pool, worker_id)
        seen.append((id(pool), {k: id(v) for k, v in pool._models.items()}, len(loads)))
        return state

    monkeypatch.setattr(engine.service.worker.loop, "run_session", recording_run_session)
    first = queue(store, prompts=2, drafts=(DRAFT,), gammas=(1,))
    second = queue(store, prompts=3, drafts=(DRAFT,), gammas=(2,))
    assert engine.service.worker.loop.serve(store, once=True) == 2

    assert store.get_session(first)["status"] == "done"
    assert store.get_session(second)["status"] == "done"
    assert sorted(loads) == sorted([TARGET, DRAFT])  # loaded once each, for the first session only
    (pool1, models1, loads1), (pool2, models2, loads2) = seen
    assert pool1 == pool2 and loads1 == loads2 == 2
    assert models1 == models2  # the very same model objects served the second session


# --- cancel ---------------------------------------------------------------------------------------------


def test_cancel_running_session_stops_within_a_second(home: Path, store: Store) -> None:
    sid = queue_long(store)
    thread, result = serve_in_thread(home)
    try:
        wait_for(
            lambda: store.get_session(sid)["status"] == "running" and step_count(store, sid) > 0,
            60,
            "the session to log steps",
        )
        before = step_count(store, sid)
        assert store.request_cancel(sid)
        t0 = time.monotonic()
        wait_for(lambda: store.get_session(sid)["status"] != "running", 5, "the cancel", interval_s=0.02)
        elapsed = time.monotonic() - t0
    finally:
        thread.join(60)
    assert "error" not in result, result.get("error")
    session = store.get_session(sid)
    assert session["status"] == "cancelled" and session["cancel_requested"] is True
    assert elapsed < 1.5, f"cancel took {elapsed:.2f} s"
    assert step_count(store, sid) >= before > 0  # the steps logged so far are kept
    statuses = [r["status"] for r in store.list_runs(sid)]
    assert "running" not in statuses and statuses[-1] == "cancelled"


# --- a worker killed mid-session ----------------------------------------------------------------------


def test_sigkill_mid_session_is_recovered_by_the_next_worker(home: Path, store: Store) -> None:
    sid = queue_long(store, prompts=8)
    proc = start_worker(home)
    try:
        wait_for(lambda: step_count(store, sid) > 0 or proc.poll() is not None, 90, "the worker to log steps")
        assert proc.poll() is None, worker_log(home)
        os.kill(proc.pid, signal.SIGKILL)
        # Not reaped on purpose, like a worker started by the dashboard: a zombie must count as dead.
        wait_for(lambda: _is_zombie_or_gone(proc.pid), 10, "the worker to die")

        check = open_db(home)
        try:
            with check.engine.connect() as conn:
                assert conn.execute(text("PRAGMA integrity_check")).scalar_one() == "ok"
            # whoever looks first finds the dead pid: the session is interrupted at once, its runs closed
            looked = check.get_session(sid)
            assert looked["status"] == "interrupted" and f"process {proc.pid}" in looked["error"], looked
            assert "running" not in [r["status"] for r in check.list_runs(sid)]
            kept = step_count(check, sid)
            assert kept > 0
            fresh = queue(check, prompts=1, drafts=("ngram",), gammas=(1,), max_new_tokens=8, name="after the crash")
        finally:
            check.close()

        second = start_worker(home, "--once", log_name="worker2.out")
        assert second.wait(120) == 0, worker_log(home)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)

    crashed = store.get_session(sid)
    assert crashed["status"] == "interrupted"
    assert "worker died" in crashed["error"] and f"process {proc.pid}" in crashed["error"], crashed["error"]
    assert step_count(store, sid) == kept  # the dead worker's steps are kept, untouched
    assert store.get_session(fresh)["status"] == "done", store.get_session(fresh)["error"]


def _is_zombie_or_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


# --- several workers and a busy queue ------------------------------------------------------------------


def test_two_workers_run_each_session_exactly_once(home: Path, store: Store) -> None:
    sessions = [queue(store, prompts=2, drafts=("ngram",), gammas=(1, 2), max_new_tokens=16) for _ in range(3)]
    workers = [start_worker(home, "--once", log_name=f"worker{i}.out") for i in range(2)]
    for w in workers:
        assert w.wait(180) == 0, worker_log(home)

    worker_pids = {w.pid for w in workers}
    for sid in sessions:
        session = store.get_session(sid)
        assert session["status"] == "done", (session["error"], worker_log(home))
        assert int(session["worker_id"].split(":")[1]) in worker_pids
        runs = store.list_runs(sid)
        assert [(r["draft"], r["gamma"]) for r in runs] == [("none", 0), ("ngram", 1), ("ngram", 2)]  # not doubled
        for run in runs:
            outputs = store.get_outputs(run["id"])
            assert len(outputs) == 2
            assert store.run_progress(run["id"])["steps"] == sum(o["steps"] for o in outputs)
        with store.engine.connect() as conn:
            duplicates = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT run_id, prompt_index, step_index FROM steps "
                    "JOIN runs ON runs.id = steps.run_id WHERE runs.session_id = :s "
                    "GROUP BY run_id, prompt_index, step_index HAVING count(*) > 1)"
                ),
                {"s": sid},
            ).scalar_one()
        assert duplicates == 0


def test_ten_sessions_with_cancels_end_in_the_right_state(home: Path, store: Store) -> None:
    sessions = []
    for i in range(10):
        if i == 2:
            sessions.append(queue_long(store))
        else:
            sessions.append(queue(store, prompts=1, drafts=("ngram",), gammas=(1,), max_new_tokens=8, name=f"s{i}"))
    queued_cancel, running_cancel = sessions[4], sessions[2]
    assert store.request_cancel(queued_cancel)
    assert store.get_session(queued_cancel)["status"] == "cancelled"  # at once: it never ran

    thread, result = serve_in_thread(home)
    try:
        wait_for(lambda: step_count(store, running_cancel) > 0, 60, "the long session to log steps")
        assert store.request_cancel(running_cancel)
    finally:
        thread.join(120)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert result["ran"] == 9  # every session but the one cancelled while queued

    for i, sid in enumerate(sessions):
        session = store.get_session(sid)
        expected = "cancelled" if sid in (queued_cancel, running_cancel) else "done"
        assert session["status"] == expected, (i, session["status"], session["error"])
        if expected == "done":
            assert [r["status"] for r in store.list_runs(sid)] == ["done", "done"]
    assert store.list_runs(queued_cancel) == []
    assert store.list_sessions(status="queued") == [] and store.list_sessions(status="running") == []


# --- the command line -----------------------------------------------------------------------------------


def test_cli_submit_worker_sessions_recommend(home: Path) -> None:
    prompts = home / "prompts.txt"
    prompts.write_text("write a haiku about the sea\nexplain speculative decoding in one line\n")
    submit = engine_cli(
        home, "submit", "--target", TARGET, "--draft", "ngram", "--draft", DRAFT, "--gamma", "1", "--gamma", "2",
        "--max-new-tokens", "16", "--dtype", DTYPE, "--no-regime", "--prompts", str(prompts), "--mode", "full",
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    assert "queued session 1" in submit.stdout

    worker = engine_cli(home, "worker", "--once")
    assert worker.returncode == 0, worker.stderr[-3000:]

    listing = engine_cli(home, "sessions")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if line.split()[:1] == ["1"])
    stored = json.loads(engine_cli(home, "sessions", "--json").stdout)[0]
    # 2 prompts × (baseline + 2 drafts × 2 γ + the A/A), and the most the confirmation of an unmeasured headline may
    # add (the CLI's full mode confirms): the total planned never changes, what the confirmation did not need is done
    from engine.service.sizing.plan import planned_decodes
    from engine.session.quick import confirm_reserve
    from engine.session.spec import SessionSpec

    settings = SessionSpec.from_row(stored)
    runs = 2 * 6 + confirm_reserve(settings, 2)
    assert runs == planned_decodes(settings, 2)
    assert row.split()[1:3] == ["done", f"{runs}/{runs}"], listing.stdout

    rec = engine_cli(home, "recommend", "--session", "1", "--export", "vllm")
    assert rec.returncode == 0, rec.stderr
    config = json.loads(rec.stdout)
    assert isinstance(config, dict) and config


def test_cli_cancels_as_the_run_page_does(home: Path) -> None:
    """The Run page's Cancel had no CLI twin (issue #21, item 12: every option the page offers the CLI offers)."""
    prompts = home / "prompts.txt"
    prompts.write_text("write a haiku about the sea\n")
    for _ in range(2):
        submit = engine_cli(home, "submit", "--target", TARGET, "--draft", "ngram", "--gamma", "1", "--max-new-tokens",
                            "8", "--dtype", DTYPE, "--no-regime", "--prompts", str(prompts))  # fmt: skip
        assert submit.returncode == 0, submit.stderr
    cancel = engine_cli(home, "cancel", "--session", "1")
    assert cancel.returncode == 0 and cancel.stdout.strip() == "session 1 cancelled", cancel.stderr
    statuses = {s["id"]: s["status"] for s in json.loads(engine_cli(home, "sessions", "--json").stdout)}
    assert statuses == {1: "cancelled", 2: "queued"}  # the other is untouched
    again = engine_cli(home, "cancel", "--session", "1")
    assert again.returncode == 2 and "session 1 is cancelled: only a queued or running session" in again.stderr
    assert "Traceback" not in again.stderr
    missing = engine_cli(home, "cancel", "--session", "9")
    assert missing.returncode == 2 and "session 9 does not exist" in missing.stderr


def _bad_gguf(home: Path) -> str:
    path = home / "truncated.gguf"
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00junk")
    return str(path)


def _not_a_model(home: Path) -> str:
    path = home / "not-a-model"
    path.mkdir()
    (path / "README.md").write_text("no weights here")
    return str(path)


def _empty_file(home: Path) -> str:
    path = home / "empty.txt"
    path.write_text("")
    return str(path)


BAD_SUBMITS: dict[str, Callable[[Path, str], list[str]]] = {
    "gamma 0": lambda h, p: ["--gamma", "0", "--prompts", p],
    "gamma 1000": lambda h, p: ["--gamma", "1000", "--prompts", p],
    "negative temperature": lambda h, p: ["--temperature", "-1", "--prompts", p],
    "max new tokens 0": lambda h, p: ["--max-new-tokens", "0", "--prompts", p],
    "missing prompt file": lambda h, p: ["--prompts", str(h / "no-such-prompts.txt")],
    "empty prompt file": lambda h, p: ["--prompts", _empty_file(h)],
    "unknown model": lambda h, p: ["--target", "no/such-model", "--prompts", p],
    "truncated gguf": lambda h, p: ["--target", _bad_gguf(h), "--prompts", p],
    "directory not a model": lambda h, p: ["--target", _not_a_model(h), "--prompts", p],
}


@pytest.mark.parametrize("case", list(BAD_SUBMITS))
def test_cli_refuses_bad_input_with_one_line(home: Path, case: str) -> None:
    prompts = home / "prompts.txt"
    prompts.write_text("hello there\n")
    base = ["submit", "--target", TARGET, "--draft", "ngram", "--dtype", DTYPE, "--no-regime"]
    result = engine_cli(home, *base, *BAD_SUBMITS[case](home, str(prompts)))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "queued" not in result.stdout
    check = open_db(home)
    try:
        assert check.list_sessions() == []  # nothing queued
    finally:
        check.close()

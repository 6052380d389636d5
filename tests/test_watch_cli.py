"""`python -m engine watch` refuses bad input in one line with exit 2, and reports a source that is down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_calls import cli, one_line
from watch_parts import ngram_session

from engine.service.cli.watch import duration_s
from store import open_store


@pytest.fixture()
def session_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    url = f"sqlite:///{tmp_path / 'spectune.db'}"
    monkeypatch.setenv("SPECTUNE_DB_URL", url)
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    with open_store(url) as store:
        return ngram_session(store)


def test_durations() -> None:
    assert (duration_s("15s"), duration_s("2m"), duration_s("30"), duration_s("1500ms")) == (15.0, 120.0, 30.0, 1.5)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--metrics-url", "http://127.0.0.1:9", "--window", "soon"], "write a duration"),
        (["--metrics-url", "http://127.0.0.1:9", "--window", "0.2s"], "at least 1 s"),
        (["--metrics-url", "127.0.0.1:9"], "not an http(s) URL"),
        (["--metrics-url", "http://127.0.0.1:9", "--windows", "0"], "--windows 0"),
        (["--prometheus", "http://127.0.0.1:9", "--match", "job=llama"], "label matchers"),
        (["--metrics-url", "http://127.0.0.1:9", "--draft", "ngram:1-2"], "did not measure draft"),
        (["--metrics-url", "http://127.0.0.1:9", "--gamma", "0"], "at least 1 token"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str, session_id: int, capsys) -> None:
    code, out, err = cli(["watch", "--session", session_id, *args], capsys)
    assert code == 2 and said in one_line(err), err


def test_a_session_that_does_not_exist(session_id: int, capsys) -> None:
    code, _, err = cli(["watch", "--metrics-url", "http://127.0.0.1:9", "--session", 999], capsys)
    assert code == 2 and "session 999" in one_line(err)


def test_a_source_that_is_down_is_a_state_line_not_a_crash(session_id: int, capsys, tmp_path: Path) -> None:
    code, out, err = cli(["watch", "--metrics-url", "http://127.0.0.1:9", "--session", session_id, "--gamma", "4",
                          "--window", "1s", "--windows", "2", "--deployment", "gone"], capsys)  # fmt: skip
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and err == "", out + err
    assert all("source down" in line and "refused" in line for line in lines[1:])
    with open_store(f"sqlite:///{tmp_path / 'spectune.db'}") as store:
        assert [w["verdict"] for w in store.list_watch_windows("gone")] == ["source down", "source down"]


def test_the_deployed_gamma_defaults_to_the_sessions_recommendation(session_id: int, tmp_path: Path) -> None:
    from engine.service.decide.evidence import recommend_from_store
    from engine.service.watch import deployment_for

    with open_store(f"sqlite:///{tmp_path / 'spectune.db'}") as store:
        dep = deployment_for(store, session_id)
        rec = recommend_from_store(store, [session_id])[0]
    assert dep.measurement.name == "ngram:3-4" and dep.alpha_band == (0.3, 0.99)
    assert rec.draft_name == "ngram:3-4" and dep.gamma == rec.gamma >= 1  # "deployed as recommended"


def test_without_gamma_an_unreadable_server_leaves_the_sessions_recommendation(session_id: int, capsys) -> None:
    code, out, _ = cli(["watch", "--metrics-url", "http://127.0.0.1:9", "--session", session_id, "--window", "1s",
                        "--windows", "1"], capsys)  # fmt: skip
    header = out.splitlines()[0]
    assert code == 0 and "(the session's recommendation; the server could not be read for its γ" in header, out


@pytest.fixture()
def not_an_engine() -> Iterator[str]:
    """A real HTTP server that answers every GET with a web page: neither Prometheus text nor the query API's JSON."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"<html><body>a web page</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("source", ["--metrics-url", "--prometheus"])
def test_a_malformed_answer_is_a_state_line_and_the_window_is_kept(
    source: str, session_id: int, not_an_engine: str, capsys, tmp_path: Path
) -> None:
    code, out, err = cli(["watch", source, not_an_engine, "--session", session_id, "--gamma", "4", "--window", "1s",
                          "--windows", "2", "--deployment", "page"], capsys)  # fmt: skip
    lines = out.splitlines()
    assert code == 0 and err == "" and len(lines) == 3, out + err
    assert all(line.split("  ", 1)[1].startswith("malformed: ") for line in lines[1:]), out
    with open_store(f"sqlite:///{tmp_path / 'spectune.db'}") as store:
        assert [w["verdict"] for w in store.list_watch_windows("page")] == ["malformed", "malformed"]

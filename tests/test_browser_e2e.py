"""End to end in a real browser: the dashboard, the real worker, tiny models, headless Chromium.

Upload a prompt file → save it → start a session (tiny target + noisy tiny draft) → watch the live
view advance → see it finish → find it on the Sessions page. Screenshots go to artifacts/e2e/.
Needs Debian's chromium (`make browser`); skipped when it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from foundation.processes import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "e2e"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
TIMEOUT_MS = 120_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed (make browser)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("streamlit did not become healthy in time")


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def dashboard(tmp_path):
    """The real dashboard on a free port with its own data directory; stops it and the worker it started."""
    home = tmp_path / "home"
    env = dict(os.environ, SPECTUNE_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("SPECTUNE_DB_URL", None)
    port = _free_port()
    log = open(tmp_path / "streamlit.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.serve", "--server.port", str(port), "--server.headless",
         "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,  # gone with the suite
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url, home
    finally:
        _stop(proc.pid)
        log.close()
        pid_file = home / "worker.pid"
        if pid_file.exists():
            try:
                _stop(int(pid_file.read_text().strip()))
            except ValueError:
                pass
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # keep the logs next to the screenshots
        shutil.copy(tmp_path / "streamlit.log", ARTIFACTS / "streamlit.log")
        if (home / "worker.log").exists():
            shutil.copy(home / "worker.log", ARTIFACTS / "worker.log")


def _shot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main container, so grow the viewport to fit it first."""
    size = page.viewport_size
    height = page.evaluate(
        "() => Math.max(...['[data-testid=stMain]', '[data-testid=stAppViewContainer]', 'section.main']"
        ".map(s => document.querySelector(s)).filter(Boolean).map(e => e.scrollHeight), 800)"
    )
    page.set_viewport_size({"width": size["width"], "height": min(int(height) + 40, 8000)})
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def _progress_text(page) -> str:
    bar = page.get_by_text(re.compile(r"Progress: \d+ / \d+")).first
    return bar.inner_text(timeout=TIMEOUT_MS)


def test_upload_run_watch_and_review(dashboard, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from engine.session.quick import confirm_reserve
    from engine.session.spec import SessionSpec

    url, home = dashboard
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prompt_file = tmp_path / "e2e_prompts.txt"
    prompt_file.write_text("write a short note about the sea.\nlist three colours of the rainbow.\n", encoding="utf-8")

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            # Prompts: upload and save
            page.goto(f"{url}/Prompts")
            page.locator('input[type="file"]').set_input_files(str(prompt_file))
            expect(page.get_by_text("Preview: e2e_prompts.txt")).to_be_visible()
            name = page.get_by_label("Name of the prompt set", exact=True)
            name.fill("e2e prompts")
            name.press("Enter")
            page.get_by_role("button", name="Save prompt set").click()
            expect(page.get_by_text(re.compile(r"Saved set #\d+"))).to_be_visible()
            _shot(page, "1_prompts_saved")

            # Run: tiny target and draft typed in, 2 prompts, 24 tokens
            page.goto(f"{url}/Run")
            page.get_by_label("…or another target", exact=True).fill(TARGET)
            page.get_by_role("button", name="Remove qwen2.5-coder-0.5b").click()
            page.get_by_label("…and other drafts (comma-separated)", exact=True).fill(DRAFT)
            page.get_by_label("…or type γ values", exact=True).fill("1,3")
            page.get_by_label("Max new tokens", exact=True).fill("24")
            page.get_by_label("How many prompts", exact=True).fill("2")
            page.get_by_label("Session name (optional)", exact=True).fill("e2e session")
            page.get_by_text("Full grid: every draft × γ × policy measured").click()  # quick is the default
            page.get_by_role("button", name="Start session").click()
            expect(page.get_by_text(re.compile(r"Session #\d+ queued"))).to_be_visible()
            # the URL carries the session (refresh-safe); the browser applies it just after the rerun's elements
            expect(page).to_have_url(re.compile(r"[?&]session=\d+"))

            # Live view: the progress text changes while the worker decodes, then the session is done
            first = _progress_text(page)
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            seen = {first}
            while time.monotonic() < deadline:
                text = _progress_text(page)
                if text not in seen and "— running" in text and not re.search(r"Progress: 0 /", text):
                    _shot(page, "2_run_live")
                seen.add(text)
                if "— done" in text or page.get_by_text("Done.", exact=True).count():
                    break
                if "— failed" in text:
                    _shot(page, "2_run_failed")
                    pytest.fail(f"session failed: {page.locator('[data-testid=stAlert]').all_inner_texts()}")
                page.wait_for_timeout(300)
            _shot(page, "2_run_done")
            assert len(seen) >= 2, f"the live view never changed: {seen}"
            expect(page.get_by_text("Done.", exact=True)).to_be_visible()
            final = _progress_text(page)
            done, total = map(int, re.search(r"Progress: (\d+) / (\d+)", final).groups())
            # 2 prompts × (baseline, 2 γ values and the A/A decode), and the most the headline's confirmation may add
            # (planned from the start; what it did not need counts as done)
            reserved = confirm_reserve(SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[1, 3]), 2)
            assert done == total == 2 * (1 + 2 + 1) + reserved, final

            # A refresh keeps watching the same session (its id is in the address)
            page.reload()
            expect(page.get_by_text("e2e session").first).to_be_visible()

            # Sessions: the finished session with its runs
            session_id = re.search(r"session=(\d+)", page.url).group(1)
            page.goto(f"{url}/Sessions?session={session_id}")
            expect(page.get_by_role("heading", name=re.compile(rf"#{session_id} e2e session"))).to_be_visible()
            expect(page.get_by_text("Fidelity: is the speculative output the target's?")).to_be_visible()
            page.wait_for_timeout(1000)
            _shot(page, "3_sessions")
        finally:
            browser.close()

    from store import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    try:
        session = store.get_session(int(session_id))
        assert session["status"] == "done", session.get("error")
        runs = store.list_runs(session["id"])
        assert [r["kind"] for r in runs] == ["baseline", "speculative", "speculative"]
        assert all(r["status"] == "done" for r in runs)
    finally:
        store.close()


def test_the_run_form_is_as_submitted_after_another_page_while_a_session_runs(dashboard):
    """Start, let the live view poll a while, open Sessions from the sidebar and come back: the form is as submitted
    (Streamlit dropped the Run page's widget values meanwhile, and the form once came back at its defaults)."""
    from playwright.sync_api import expect, sync_playwright

    from store import open_store

    url, home = dashboard
    home.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    store.add_prompt_set("ten", "ten.txt", [{"text": f"count to {i}", "category": None} for i in range(10)])
    store.close()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(f"{url}/Run")
            page.get_by_label("…or another target", exact=True).fill(TARGET)
            page.get_by_label("…and other drafts (comma-separated)", exact=True).fill(DRAFT)
            page.locator("[data-testid=stMultiSelect]").first.click()
            page.get_by_role("option", name="ngram").click()
            page.keyboard.press("Escape")
            page.get_by_label("Max new tokens", exact=True).fill("16")
            page.get_by_label("How many prompts", exact=True).fill("3")
            page.get_by_label("Session name (optional)", exact=True).fill("kept")
            page.get_by_role("button", name="Start session").click()
            expect(page.get_by_text(re.compile(r"Session #\d+ queued"))).to_be_visible()
            page.wait_for_timeout(15_000)  # the live view polls meanwhile
            page.locator("[data-testid=stSidebarNav] a", has_text="Sessions").click()
            expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
            page.locator("[data-testid=stSidebarNav] a", has_text="Run").click()
            expect(page.get_by_label("Max new tokens", exact=True)).to_be_visible()
            page.wait_for_timeout(2000)
            values = {label: page.get_by_label(label, exact=True).input_value()
                      for label in ("…or another target", "Max new tokens", "How many prompts",
                                    "Session name (optional)")}  # fmt: skip
            assert values == {"…or another target": TARGET, "Max new tokens": "16", "How many prompts": "3",
                              "Session name (optional)": "kept"}, values  # fmt: skip
            drafts = page.locator("[data-testid=stMultiSelect]").first.inner_text()
            assert "ngram" in drafts and "qwen2.5-coder-0.5b" in drafts, drafts
        finally:
            browser.close()

"""What every page shares: page config, the cached store, the hardware banner, safe error display, escaping.

The dashboard never runs a model in its own script run: it validates, queues sessions and reads the
store. Anything the user typed or uploaded is shown through ``esc`` (HTML) or ``md_escape``
(Streamlit markdown), so a prompt holding ``<script>`` or markdown tricks shows as text.
"""

from __future__ import annotations

import html
import re
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import streamlit as st

from engine.errors import SpectuneError
from engine.service.api import StoredSession
from foundation.paths import default_database_url

T = TypeVar("T")

APP_NAME = "spectune"
PAGES = {
    "Home": "Home.py",
    "Prompts": "pages/1_Prompts.py",
    "Run": "pages/2_Run.py",
    "Sessions": "pages/3_Sessions.py",
    "Theory": "pages/4_Theory.py",
    "Recommend": "pages/5_Recommend.py",
    "Endpoints": "pages/6_Endpoints.py",
    "Policies": "pages/7_Policies.py",
    "Watch": "pages/8_Watch.py",
}
ACTIVE_STATUSES = ("queued", "running")
# Plain-text marks for option labels (no markdown there), in fonts every browser has: no emoji font is needed.
STATUS_ICONS = {"queued": "◷", "running": "▶", "done": "✓", "failed": "✗", "cancelled": "■", "interrupted": "‖",
                "stalled": "⚠"}  # fmt: skip
# Streamlit's Material Symbols (its own font) for icons and alerts, one per thing shown.
ICONS = {
    "app": ":material/bolt:", "error": ":material/block:", "cpu": ":material/computer:", "gpu": ":material/memory:",
    "Prompts": ":material/edit_note:", "Run": ":material/play_arrow:", "Sessions": ":material/bar_chart:",
    "Theory": ":material/functions:", "Recommend": ":material/target:", "Endpoints": ":material/public:",
    "Policies": ":material/explore:", "Watch": ":material/monitor_heart:",
    "on": ":material/check_circle:", "off": ":material/do_not_disturb_on:",
    "measure": ":material/straighten:", "gpu_note": ":material/trending_down:", "save": ":material/save:",
    "info": ":material/info:", "warning": ":material/warning:",
}  # fmt: skip
WORKER_DOT = {True: ":green[●]", False: ":gray[○]"}

# Markdown (and Streamlit's LaTeX `$`) punctuation that could turn text into links, images, emphasis or HTML.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-!|<>~$&:])")


def esc(text: Any) -> str:
    """HTML-escape anything shown inside st.html / unsafe markdown."""
    return html.escape("" if text is None else str(text), quote=True)


def md_escape(text: Any) -> str:
    """Escape text for Streamlit markdown (st.markdown, st.error, st.caption, labels): shown literally."""
    escaped = _MD_SPECIAL.sub(r"\\\1", "" if text is None else str(text))
    return escaped.replace("\n", "  \n")


def one_line(text: Any, limit: int = 300) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def page_setup(title: str, icon: str = ICONS["app"], keep: Iterable[str] = ()) -> None:
    """Page config plus the sidebar note every page carries; the kept widgets' values (this page's `keep` among
    them) carried across pages."""
    st.set_page_config(page_title=f"{APP_NAME} · {title}", page_icon=icon, layout="wide")
    store_banner()
    if keep:
        keep_across_pages(keep)
    for key in st.session_state.get(KEPT_KEYS, ()):
        if key in st.session_state:  # a widget not drawn this run loses its value unless it is set again
            st.session_state[key] = st.session_state[key]


KEPT_KEYS = "_kept_across_pages"


def keep_across_pages(keys: Iterable[str]) -> None:
    """Keep these widgets' values when the user opens another page and comes back: Streamlit forgets a widget's
    value after a run that does not draw it, so every page's setup sets the kept ones again."""
    from streamlit import config

    if not config.get_option("global.disableWidgetStateDuplicationWarning"):
        config.set_option("global.disableWidgetStateDuplicationWarning", True)  # a kept value beside its default
    kept = st.session_state.setdefault(KEPT_KEYS, [])
    kept.extend(key for key in keys if key not in kept)


# ----------------------------------------------------------------------------------------------------------------------
# errors


def show_error(exc: BaseException, action: str | None = None) -> None:
    """One clear line for the user: SpectuneError (incl. StoreError) messages as they are, anything else named."""
    prefix = f"Could not {action}: " if action else ""
    if isinstance(exc, SpectuneError):
        st.error(md_escape(prefix + one_line(str(exc), 1000)), icon=ICONS["error"])
    else:
        detail = one_line(str(exc), 500) or "no details"
        st.error(
            md_escape(f"{prefix}unexpected {type(exc).__name__}: {detail}. Nothing stored was changed by this error."),
            icon=ICONS["error"],
        )
        traceback.print_exc()  # for the server log, never the page


@contextmanager
def guard(action: str | None = None) -> Iterator[None]:
    """Run a block; show its error (never a traceback) and carry on with the rest of the page."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the page must survive anything a block raises
        if _is_streamlit_control_flow(exc):
            raise
        show_error(exc, action)


def _is_streamlit_control_flow(exc: BaseException) -> bool:
    """st.rerun / st.stop / st.switch_page raise exceptions that must pass through."""
    from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

    return isinstance(exc, ScriptControlException)


def attempt(fn: Callable[..., T], *args: Any, action: str | None = None, **kwargs: Any) -> T | None:
    """Call fn; on error show it and return None."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        if _is_streamlit_control_flow(exc):
            raise
        show_error(exc, action)
        return None


# ----------------------------------------------------------------------------------------------------------------------
# store and hardware


@st.cache_resource(show_spinner=False)
def _open_store(url: str) -> Any:
    """One Store per database URL (the URL is the cache key; open_app_store reads the same URL)."""
    from engine.service.api import open_app_store

    return open_app_store(url)


def store_banner() -> None:
    """A banner at the top of every page while the database is damaged, or deleted or moved under the dashboard,
    or a session is stalled on a full disk: what happened, and the way out. A file put in its place (a restore)
    is followed, and said once. A database that cannot be opened at all is left to the page's own get_store."""
    try:
        store = _open_store(default_database_url())
        why = store.replaced()
        if why is not None and store.follow_replacement():
            st.info(md_escape(f"The {why}; the pages now show the file at that path."), icon=ICONS["info"])
            why = None
        notice = store.damage_notice()
        stalled = store.stalled_sessions()
    except Exception:  # noqa: BLE001 - the banner never stops a page
        return
    for session_id, cause in stalled:
        st.warning(
            md_escape(
                f"Session {session_id} is stalled: {cause}. Its end is written as soon as the disk "
                "has room; free some space."
            ),
            icon=ICONS["warning"],
        )
    if why is not None:
        st.error(
            md_escape(
                f"The {why}: these pages show what the old file held, and nothing new can be stored. "
                "Put a backup in place with python -m engine restore FILE (no worker running), then "
                "reload."
            ),
            icon=ICONS["warning"],
        )
    if notice:
        st.error(md_escape(f"The {notice[0].lower()}{notice[1:]}"), icon=ICONS["warning"])


def get_store() -> Any:
    """The dashboard's Store; a database that cannot be opened stops the page with one clear line."""
    try:
        return _open_store(default_database_url())  # SPECTUNE_HOME that cannot be a folder is refused here too
    except Exception as exc:  # noqa: BLE001
        show_error(exc, "open the database")
        st.info("Set SPECTUNE_HOME or SPECTUNE_DB_URL to use another database, then reload the page.")
        st.stop()


@st.cache_resource(show_spinner=False)
def hardware() -> dict[str, Any]:
    try:
        from engine.service.api import describe_hardware

        return describe_hardware()
    except Exception as exc:  # noqa: BLE001 - describe_hardware never raises, but be safe
        return {"kind": "cpu", "label": f"CPU (hardware could not be described: {exc})"}


def hardware_banner() -> None:
    hw = hardware()
    icon = ICONS["gpu"] if hw.get("kind") == "cuda" else ICONS["cpu"]
    st.caption(f"{icon} Decoding hardware: **{md_escape(hw.get('label', 'unknown'))}**")


def worker_status() -> tuple[int | None, str]:
    """(pid or None, one line) for the background worker."""
    from engine.service.api import worker_alive

    try:
        pid = worker_alive()
    except Exception as exc:  # noqa: BLE001
        return None, f"worker status unknown ({exc})"
    if pid:
        return pid, f"worker running (pid {pid})"
    return None, "no worker running — it starts when you start a session"


def start_worker() -> str:
    from engine.service.api import ensure_worker

    return ensure_worker()


# ----------------------------------------------------------------------------------------------------------------------
# formatting


def fmt_num(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "—"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if number != number:  # NaN
        return "—"
    return f"{number:.{digits}f}{suffix}"


def fmt_time(value: Any) -> str:
    if value is None:
        return "—"
    try:
        return value.strftime("%Y-%m-%d %H:%M")
    except AttributeError:
        return str(value)[:16]


def session_label(session: dict[str, Any]) -> str:
    """`#12 ✓ name · llama.cpp (done)` for selectboxes: the engine it measured in is part of its name (escaped by
    Streamlit's plain-text option rendering)."""
    icon = STATUS_ICONS.get(session.get("status", ""), "")
    name = one_line(session.get("name") or "", 60)
    engine = StoredSession.of(session).engine
    return f"#{session['id']} {icon} {name} · {engine} ({session.get('status')})"


def query_int(key: str) -> int | None:
    """An integer query parameter, or None when absent or malformed."""
    raw = st.query_params.get(key)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------------------------------
# generated text


@st.cache_data(show_spinner=False, max_entries=256)
def token_strings_cached(target: str, token_ids: tuple[int, ...]) -> list[str] | None:
    """Per-token text from the target's tokenizer only (never the weights); None when it cannot be loaded."""
    try:
        from engine.service.api import token_strings

        strings = token_strings(target, list(token_ids))
    except Exception:  # noqa: BLE001 - the caller falls back to the stored text
        return None
    return [str(s) for s in strings] if len(strings) == len(token_ids) else None


def show_output(target: str, output: dict[str, Any]) -> None:
    """A stored output with draft-accepted tokens highlighted; the plain stored text when tokens can't be shown."""
    from app import render

    token_ids = tuple(int(t) for t in output.get("token_ids") or [])
    from_draft = output.get("from_draft") or []
    if token_ids and not from_draft:  # an engine that does not say which tokens came from the draft (llama.cpp)
        st.caption("This engine does not report which tokens came from the draft; the text is shown plain.")
        st.html(render.plain_text_box(output.get("text") or ""))
        return
    strings = token_strings_cached(target, token_ids) if token_ids else None
    if strings is not None:
        st.html(render.legend() + render.highlight_tokens(strings, from_draft))
        return
    share = render.draft_share(from_draft)
    st.caption(
        "Per-token text unavailable (the tokenizer cannot be loaded here); the stored text is shown"
        + (f" — {share:.0%} of its tokens came from the draft." if share is not None else ".")
    )
    st.html(render.plain_text_box(output.get("text") or ""))

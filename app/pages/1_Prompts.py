"""Prompts: upload (or paste) prompts that look like your traffic, preview them, save them as a set.

Every good line is imported and every bad one reported by its line number; a file that cannot be
read at all is refused with one line naming the problem. Prompt text is only ever shown as plain
text (tables) or escaped.
"""

import streamlit as st

from app import charts, common, components, data, prompt_upload
from app.common import md_escape
from engine.errors import PromptFileError

common.page_setup("Prompts")
st.title("Prompts")
st.caption(
    "Acceptance α is a property of the models *and the task*: measure it on prompts shaped like your traffic. "
    "Upload a sample, or start from one of the bundled sets."
)
common.hardware_banner()
store = common.get_store()

PENDING = "prompts_pending"
UPLOAD_KEY = "prompts_upload_seen"


def set_pending(parsed: prompt_upload.Parsed | None) -> None:
    if parsed is None:
        st.session_state.pop(PENDING, None)
    else:
        st.session_state[PENDING] = parsed


def show_refusal(exc: BaseException, filename: str, what: str | None = None) -> None:
    """A refused file, named once, with its bad lines listed; any other error as one line."""
    if not isinstance(exc, PromptFileError):
        common.show_error(exc, f"read {what or filename}")
        return
    headline, lines = prompt_upload.refusal(exc, filename, what)
    listed = "\n".join(f"- {md_escape(line)}" for line in lines)
    st.error("\n\n".join([md_escape(headline), listed]), icon=common.ICONS["error"])


tab_upload, tab_paste, tab_samples = st.tabs(["Upload a file", "Paste prompts", "Bundled samples"])

with tab_upload:
    st.caption(
        f"Formats: plain text (one prompt per line), JSONL, JSON, CSV — up to {prompt_upload.size_limit_text()}. "
        "JSON/JSONL records need a `prompt`, `text`, `turns`, `messages` or `conversations` field "
        f"({prompt_upload.MULTI_TURN_NOTE}); an optional `category` is used for the per-category breakdown."
    )
    upload = st.file_uploader(  # any type: the reason a file is refused shows as an error line, not a tooltip
        "Prompt file", key="prompt_file", max_upload_size=prompt_upload.MAX_UPLOAD_MB
    )
    if upload is not None:
        seen = (getattr(upload, "file_id", None) or upload.name, upload.size)
        if st.session_state.get(UPLOAD_KEY) != seen:
            st.session_state[UPLOAD_KEY] = seen
            try:
                set_pending(prompt_upload.parse_upload(upload.getvalue(), upload.name))
            except Exception as exc:  # noqa: BLE001 - shown as one line
                set_pending(None)
                st.session_state["prompts_upload_error"] = exc
            else:
                st.session_state.pop("prompts_upload_error", None)
        if st.session_state.get("prompts_upload_error") is not None:
            show_refusal(st.session_state["prompts_upload_error"], upload.name)
    else:
        st.session_state.pop(UPLOAD_KEY, None)
        st.session_state.pop("prompts_upload_error", None)

with tab_paste:
    pasted = st.text_area(
        "Paste prompts",
        key="paste_text",
        height=160,
        placeholder='One prompt per line, or JSONL records like {"prompt": "…", "category": "coding"}',
    )
    paste_format = st.selectbox("Pasted format", list(prompt_upload.PASTE_FORMATS), key="paste_format")
    if st.button("Parse pasted prompts", key="parse_paste"):
        try:
            set_pending(prompt_upload.parse_pasted(pasted, prompt_upload.PASTE_FORMATS[paste_format]))
        except Exception as exc:  # noqa: BLE001
            set_pending(None)
            show_refusal(exc, f"pasted.{prompt_upload.PASTE_FORMATS[paste_format]}", "the pasted prompts")

with tab_samples:
    st.caption("Short prompt sets written for this project; one click imports a set (importing twice is harmless).")
    samples = prompt_upload.sample_files()
    if not samples:
        st.info("No bundled samples found in samples/.")
    cols = st.columns(max(1, len(samples)))
    for col, path in zip(cols, samples, strict=False):
        with col:
            if st.button(f"Import {path.name}", key=f"sample_{path.name}", width="stretch"):
                try:
                    set_id, added, dupes, parsed = prompt_upload.import_sample(store, path)
                except Exception as exc:  # noqa: BLE001
                    common.show_error(exc, f"import {path.name}")
                else:
                    if added:
                        st.success(f"Imported {md_escape(path.name)} as set #{set_id}: {added} prompts.")
                    else:
                        st.info(f"{md_escape(path.name)} is already stored as set #{set_id}.")

# ---------------------------------------------------------------------------------------------------------------------
# Preview of what was parsed, then save

parsed = st.session_state.get(PENDING)
if parsed is not None:
    st.divider()
    st.subheader(f"Preview: {md_escape(parsed.filename)}")
    result, summary = parsed.result, parsed.summary
    m = st.columns(4)
    m[0].metric("Prompts", summary["count"])
    m[1].metric("Format", summary["format"])
    m[2].metric("Duplicates removed", summary["duplicates_removed"])
    m[3].metric("Issues", summary["issues"])

    if result.issues:
        bad_lines = sum(1 for i in result.issues if i.line is not None)
        note = f"{bad_lines} line(s) could not be imported" if bad_lines else "The file has issues"
        st.warning(f"{note}; every good line is kept. The problems, by line:", icon=common.ICONS["warning"])
        components.table(prompt_upload.issues_frame(parsed))
    if not result.prompts:
        st.error(f"No prompt could be imported from {md_escape(parsed.filename)}; fix the lines listed above.")
    else:
        st.caption(prompt_upload.preview_caption(parsed))
        components.table(prompt_upload.preview_frame(parsed))
        left, right = st.columns(2)
        with left:
            st.altair_chart(
                charts.bar_counts(prompt_upload.categories_frame(parsed), "category", "prompts", "Categories"),
                width="stretch",
            )
        with right:
            lengths = prompt_upload.lengths_frame(parsed)
            field = lengths.columns[0]
            st.altair_chart(charts.histogram(lengths, field, f"Prompt length ({field})"), width="stretch")
        name = st.text_input("Name of the prompt set", value=parsed.default_name, max_chars=200, key="set_name")
        save_col, discard_col = st.columns([1, 5])
        if save_col.button("Save prompt set", type="primary", key="save_set"):
            try:
                set_id, added, dupes = prompt_upload.save(store, parsed, name)
            except Exception as exc:  # noqa: BLE001
                common.show_error(exc, "save the prompt set")
            else:
                set_pending(None)
                if added:
                    extra = f" ({dupes} repeated prompts stored once)" if dupes else ""
                    st.success(f"Saved set #{set_id} “{md_escape(name)}”: {added} prompts{extra}.")
                else:
                    st.info(f"These prompts are already stored as set #{set_id}; nothing was added.")
        if discard_col.button("Discard", key="discard_set"):
            set_pending(None)
            st.rerun()

# ---------------------------------------------------------------------------------------------------------------------
# Stored sets

st.divider()
st.subheader("Stored prompt sets")
with common.guard("list the prompt sets"):
    sets = store.list_prompt_sets()
    if not sets:
        st.info("No prompt sets yet: upload a file, paste prompts, or import a bundled sample above.")
    else:
        components.table(prompt_upload.sets_frame(sets), dates=["created"])
        by_id = {s["id"]: s for s in sets}
        chosen = st.selectbox(
            "Open a set", list(by_id), format_func=lambda i: data.prompt_set_label(by_id[i]), key="open_set"
        )
        if chosen is not None:
            prompts = store.get_prompts(chosen, limit=prompt_upload.STORED_ROWS)
            st.caption(f"First {len(prompts)} prompts of set #{chosen}:")
            components.table(prompt_upload.stored_prompts_frame(prompts))
            components.confirm_delete(
                f"prompt set #{chosen}",
                lambda: store.delete_prompt_set(chosen),
                confirm=f"Yes, delete set #{chosen} (sessions that used it keep their results)",
                keys=(f"confirm_del_set_{chosen}", f"del_set_{chosen}"),
                button="Delete prompt set",
                forget=["open_set"],
            )

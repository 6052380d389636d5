"""The γ schedule without Streamlit: γ per serving batch, as a frame and in words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from engine.service.api import (
    Recommendation,
)

SCHEDULE_TEXT = (
    "The same objective and budget at every batch size. A verify step at batch b processes b·(γ+1) token rows: "
    "below the knee it rides on the weight stream (memory-bound, the extra arithmetic is free), at or past it the "
    "arithmetic is billed, so γ is capped below the crossover there; γ is off only where speculation stops paying "
    "under the objective. "
)


def schedule_frame(
    schedule: Mapping[int, int] | None, batch_size: int, knee: int | None, measured: Sequence[int] = ()
) -> pd.DataFrame:
    """Batch size → γ (0 = off), with the serving batch, the knee and the batches read from a measured surface
    marked."""
    rows = []
    for b, g in sorted((schedule or {}).items()):
        note = []
        if int(b) == int(batch_size):
            note.append("serving batch")
        if int(b) in measured:
            note.append("measured (surface)")
        if knee is not None and int(b) == int(knee):
            note.append("knee")
        rows.append({"batch size": int(b), "γ": "off" if int(g) == 0 else str(int(g)), "note": ", ".join(note)})
    return pd.DataFrame(rows, columns=["batch size", "γ", "note"])


def schedule_text(rec: Recommendation) -> str:
    """What the schedule means, with where its knee came from (markdown, no user text)."""
    if rec.knee_batch is not None:
        return SCHEDULE_TEXT + f"Knee from the stored batch sweep: batch **{rec.knee_batch}**."
    return SCHEDULE_TEXT + f"No knee is used, so every batch is judged {rec.regime}."

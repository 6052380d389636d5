"""The schema as typed ORM classes. Migrations in store/migrations must produce exactly this (a test checks).

Constraint names follow a fixed convention so Alembic's SQLite batch mode can find and alter them later.
Deletes cascade in the database (ON DELETE CASCADE), not in Python: removing a session with 20,000
steps is then one statement, and the ORM relationships below are never loaded for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from store.coltypes import UTCDateTime, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

FINAL_SESSION_STATUSES = ("done", "failed", "cancelled", "interrupted")
RUN_KINDS = ("baseline", "speculative")
RUN_STATUSES = ("queued", "running", "done", "failed", "cancelled")
SAMPLE_SOURCES = ("nvml", "cpu")

JsonList = list[Any]
JsonDict = dict[str, Any]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), JsonDict: JSON(), JsonList: JSON()}


class PromptSet(Base):
    """An uploaded prompt file. content_hash identifies the file's prompts so a re-upload finds this set."""

    __tablename__ = "prompt_sets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source_filename: Mapped[str | None] = mapped_column(String(500))
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    n_prompts: Mapped[int] = mapped_column(Integer, default=0)


class Prompt(Base):
    """One prompt; unique per set by the sha256 of its text, so uploading it again adds nothing."""

    __tablename__ = "prompts"
    __table_args__ = (
        UniqueConstraint("prompt_set_id", "content_hash"),
        Index(None, "prompt_set_id", "position"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_set_id: Mapped[int] = mapped_column(ForeignKey("prompt_sets.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    category: Mapped[str | None] = mapped_column(String(200))
    content_hash: Mapped[str] = mapped_column(String(64))
    token_count: Mapped[int | None] = mapped_column(Integer)


class TuningSession(Base):
    """One tuning job: the settings swept, its queue state and its final summary (table ``sessions``)."""

    __tablename__ = "sessions"
    __table_args__ = (Index(None, "status", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(500))
    drafts: Mapped[JsonList]  # draft refs; "ngram" and "none" are allowed
    gammas: Mapped[JsonList]
    temperatures: Mapped[JsonList]
    top_p: Mapped[float | None] = mapped_column(Float)
    top_k: Mapped[int | None] = mapped_column(Integer)
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str | None] = mapped_column(String(32))
    device: Mapped[str | None] = mapped_column(String(64))
    prompt_set_id: Mapped[int | None] = mapped_column(ForeignKey("prompt_sets.id", ondelete="SET NULL"), index=True)
    n_prompts: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int | None] = mapped_column(Integer)
    hardware: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[JsonDict | None]
    regime: Mapped[JsonDict | None]
    notes: Mapped[str | None] = mapped_column(Text)  # added by migration 0002
    options: Mapped[JsonDict | None]  # added by migration 0003
    phase: Mapped[JsonDict | None]  # what a running session does now: name, done, total, eta_s (0005)


class Run(Base):
    """One (draft, γ, temperature) point of a session's sweep, or its target-only baseline."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    draft: Mapped[str] = mapped_column(String(500))
    gamma: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="running")
    alpha: Mapped[float | None] = mapped_column(Float)
    tokens_per_call: Mapped[float | None] = mapped_column(Float)  # tokens per target call (bonus included)
    per_position_acceptance: Mapped[JsonList | None]
    c: Mapped[float | None] = mapped_column(Float)
    verify_cost: Mapped[JsonDict | None]  # {k: v(k) = t(k)/t(1), a ratio}; JSON keys come back as str
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    baseline_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    speedup_measured: Mapped[float | None] = mapped_column(Float)
    speedup_predicted: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[JsonDict | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Step(Base):
    """One engine.core.records.StepRecord. The bulk of the data: written in batches, read only through aggregates."""

    __tablename__ = "steps"
    __table_args__ = (Index(None, "run_id", "step_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    prompt_index: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    gamma: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    accept_mask: Mapped[JsonList]
    beta: Mapped[JsonList]
    draft_time_s: Mapped[float] = mapped_column(Float)
    verify_time_s: Mapped[float] = mapped_column(Float)
    draft_forwards: Mapped[int] = mapped_column(Integer)
    emitted: Mapped[int] = mapped_column(Integer)
    target_calls: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # 1 per spectune step
    t: Mapped[float] = mapped_column(Float)  # unix time the step was logged


class Output(Base):
    """One engine.core.records.PromptOutput plus its divergence verdict against the baseline."""

    __tablename__ = "outputs"
    __table_args__ = (Index(None, "run_id", "prompt_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    prompt_index: Mapped[int] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[JsonList]
    from_draft: Mapped[JsonList]
    wall_time_s: Mapped[float] = mapped_column(Float)
    steps: Mapped[int | None] = mapped_column(Integer)
    divergence: Mapped[JsonDict | None]


class UtilisationSample(Base):
    """A GPU (NVML) or CPU utilisation reading taken while a session ran."""

    __tablename__ = "utilisation_samples"
    __table_args__ = (Index(None, "session_id", "t"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    t: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(8))
    metrics: Mapped[JsonDict]  # name -> float


class Recommendation(Base):
    """A recommended configuration computed from one or more sessions for an objective."""

    __tablename__ = "recommendations"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_ids: Mapped[JsonList]
    objective: Mapped[str] = mapped_column(String(64))
    payload: Mapped[JsonDict]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Decision(Base):
    """The one decision a query over some sessions led to (the configuration or off, what it rests on), made once
    and read by every page, the CLI, the report and the exports. `session_key`: the sessions' ids, sorted, joined
    by commas; `query_key`: the query (objective, serving batch, temperature, ...) as one string; `runs_seen`: the
    newest run id of those sessions when it was made (a run stored since makes it stale)."""

    __tablename__ = "decisions"
    __table_args__ = (UniqueConstraint("session_key", "query_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    session_key: Mapped[str] = mapped_column(String(200))
    query_key: Mapped[str] = mapped_column(String(300))
    runs_seen: Mapped[int] = mapped_column(Integer, default=0)
    payload: Mapped[JsonDict]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Export(Base):
    """A file generated from a recommendation (e.g. a server config), kept so it can be downloaded again."""

    __tablename__ = "exports"

    id: Mapped[int] = mapped_column(primary_key=True)
    recommendation_id: Mapped[int] = mapped_column(ForeignKey("recommendations.id", ondelete="CASCADE"), index=True)
    format: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(500))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EndpointRequest(Base):
    """One request an endpoint session sent to a running deployment, as measured (0006).

    `endpoint` names which server it went to ("speculative", or "baseline": the same model served without
    speculation); `itl_s` holds the gaps between streamed chunks; `draft_n`/`draft_n_accepted` are what the
    server reported for this request (llama.cpp timings, SGLang sglext), NULL when it reports nothing.
    """

    __tablename__ = "endpoint_requests"
    __table_args__ = (Index(None, "session_id", "endpoint", "concurrency"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(32))
    concurrency: Mapped[int] = mapped_column(Integer)
    request_index: Mapped[int] = mapped_column(Integer)
    prompt_index: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)  # unix seconds
    ok: Mapped[bool] = mapped_column(Boolean)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    itl_s: Mapped[JsonList]
    output_tokens: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    error_kind: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    http_status: Mapped[int | None] = mapped_column(Integer)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    draft_n: Mapped[int | None] = mapped_column(Integer)
    draft_n_accepted: Mapped[int | None] = mapped_column(Integer)
    verify_calls: Mapped[int | None] = mapped_column(Integer)


class WatchWindow(Base):
    """One window of a watched deployment: when it ended, its figures (counter deltas, mean acceptance length,
    requests running, predicted speedup) and its verdict or state. Kept for a retention period, then deleted."""

    __tablename__ = "watch_windows"
    __table_args__ = (Index(None, "deployment", "ended_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200))
    ended_at: Mapped[datetime]
    seconds: Mapped[float] = mapped_column(Float)
    verdict: Mapped[str] = mapped_column(String(40))
    figures: Mapped[JsonDict]

"""Tuning sessions as a job queue: the dashboard enqueues, workers claim atomically, heartbeat and finish.

Claiming is one conditional UPDATE (compare-and-set on status='queued'), so two workers racing for
the same session cannot both win, on SQLite or PostgreSQL. A worker that dies leaves its session
'running'; store.orphans finds those by a stale heartbeat or a vanished pid (listing or reading a running
session looks), and marks them 'interrupted'.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import aliased

from store.base import StoreBase, row_dict
from store.coltypes import utcnow
from store.errors import StoreError
from store.models import FINAL_SESSION_STATUSES, TuningSession
from store.orphans import WORKER_DIED, OrphansMixin

_SETTINGS = frozenset(
    c.key
    for c in TuningSession.__mapper__.column_attrs
    if c.key
    not in {
        "id", "status", "cancel_requested", "error", "worker_id", "heartbeat_at", "created_at",
        "started_at", "finished_at", "progress_done", "progress_total", "summary", "phase",
    }
)  # fmt: skip
_REQUIRED = frozenset({"target", "drafts", "gammas", "temperatures", "max_new_tokens"})
_CLAIM_ATTEMPTS = 5


class SessionsMixin(OrphansMixin, StoreBase):
    def create_session(self, **settings: Any) -> int:
        """Queue a session; ``settings`` are sessions columns (target, drafts, gammas, temperatures, ...)."""
        unknown = set(settings) - _SETTINGS
        if unknown:
            raise TypeError(f"create_session: unknown settings {sorted(unknown)}; allowed: {sorted(_SETTINGS)}")
        missing = _REQUIRED - {key for key, value in settings.items() if value is not None}
        if missing:
            raise TypeError(f"create_session: missing settings {sorted(missing)}")
        self.refuse_new_work("queuing a session")
        now = utcnow()
        settings.setdefault("name", f"{settings['target']} {now:%Y-%m-%d %H:%M}")
        with self._write() as session:
            row = TuningSession(**settings, status="queued", cancel_requested=False, created_at=now)
            session.add(row)
            session.flush()
            return row.id

    def claim_next_session(self, worker_id: str) -> dict[str, Any] | None:
        """Atomically take the oldest queued session for ``worker_id`` (status -> running); None if none.
        DamagedStoreError when the database is damaged: no session is started in it."""
        self.refuse_new_work("starting a session")
        queued = aliased(TuningSession)
        oldest = (
            select(queued.id)
            .where(queued.status == "queued")
            .order_by(queued.created_at, queued.id)
            .limit(1)
            .scalar_subquery()
        )
        for _ in range(_CLAIM_ATTEMPTS):
            now = utcnow()
            claim = (
                update(TuningSession)
                .where(TuningSession.id == oldest, TuningSession.status == "queued")
                .values(status="running", worker_id=worker_id, started_at=now, heartbeat_at=now)
                .returning(TuningSession.id)
            )
            with self._core() as conn:
                claimed = conn.execute(claim).scalar()
            if claimed is not None:
                return self._get_session(claimed)
            # Lost a race on a server database (the row changed under us): retry only if work remains.
            with self._read() as session:
                if session.scalar(select(func.count()).where(TuningSession.status == "queued")) == 0:
                    return None
        return None

    def heartbeat(self, session_id: int, worker_id: str) -> bool:
        """Record that the worker is alive; False means it no longer owns the session and should stop."""
        stmt = (
            update(TuningSession)
            .where(
                TuningSession.id == session_id,
                TuningSession.worker_id == worker_id,
                TuningSession.status == "running",
            )
            .values(heartbeat_at=utcnow())
        )
        with self._core() as conn:
            return conn.execute(stmt).rowcount == 1

    def set_progress(self, session_id: int, done: int, total: int) -> None:
        """How many of the session's prompt × configuration units are finished."""
        self._update(session_id, progress_done=done, progress_total=total)

    def set_phase(self, session_id: int, phase: dict[str, Any] | None) -> None:
        """What the session is doing now (name, done, total, eta_s); None once it has ended."""
        self._update(session_id, phase=phase)

    def set_notes(self, session_id: int, notes: str | None) -> None:
        self._update(session_id, notes=notes)

    def set_regime(self, session_id: int, regime: dict[str, Any] | None) -> None:
        self._update(session_id, regime=regime)

    def set_hardware(self, session_id: int, hardware: str) -> None:
        """The one-line description of the machine the worker decodes on (e.g. "CPU: … — no GPU found")."""
        self._update(session_id, hardware=hardware)

    def finish_session(
        self, session_id: int, status: str, error: str | None = None, summary: dict[str, Any] | None = None
    ) -> None:
        """Mark the session done / failed / cancelled, with an error line or the final metrics."""
        if status not in FINAL_SESSION_STATUSES:
            raise ValueError(f"finish_session: status must be one of {FINAL_SESSION_STATUSES}, not {status!r}")
        self._update(session_id, status=status, error=error, summary=summary, finished_at=utcnow())

    def requeue_session(self, session_id: int) -> bool:
        """Queue an interrupted session again, or one failed because its worker died (its runs so far are kept);
        False if it is neither. A running session whose worker is gone is found first."""
        self.refuse_new_work("re-queuing a session")
        self.look_for_orphans(only=session_id)
        resumable = or_(
            TuningSession.status == "interrupted",
            (TuningSession.status == "failed") & TuningSession.error.startswith(WORKER_DIED, autoescape=True),
        )
        with self._core() as conn:
            return bool(
                conn.execute(
                    update(TuningSession)
                    .where(TuningSession.id == session_id, resumable)
                    .values(
                        status="queued",
                        worker_id=None,
                        error=None,
                        finished_at=None,
                        cancel_requested=False,
                        phase=None,
                        progress_done=0,
                    )
                ).rowcount
            )

    def request_cancel(self, session_id: int) -> bool:
        """Cancel: a queued session is cancelled at once; a running one is flagged for its worker to stop; one whose
        worker is gone (interrupted) is cancelled at once."""
        self.look_for_orphans(only=session_id)
        now = utcnow()
        with self._core() as conn:
            queued = conn.execute(
                update(TuningSession)
                .where(TuningSession.id == session_id, TuningSession.status.in_(("queued", "interrupted")))
                .values(status="cancelled", cancel_requested=True, finished_at=now)
            ).rowcount
            running = conn.execute(
                update(TuningSession)
                .where(TuningSession.id == session_id, TuningSession.status == "running")
                .values(cancel_requested=True)
            ).rowcount
        return bool(queued or running)

    def is_cancel_requested(self, session_id: int) -> bool:
        """Whether the worker should stop: cancel requested, session cancelled, or session deleted."""
        with self._read() as session:
            row = session.execute(
                select(TuningSession.cancel_requested, TuningSession.status).where(TuningSession.id == session_id)
            ).first()
        return row is None or bool(row.cancel_requested) or row.status == "cancelled"

    def list_sessions(self, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Sessions newest first, optionally only those with ``status``; a running one whose worker is gone is
        marked interrupted first, one whose end waits for room on the disk reads 'stalled'."""
        self.look_for_orphans()
        query = select(TuningSession).order_by(TuningSession.created_at.desc(), TuningSession.id.desc()).limit(limit)
        if status is not None:
            query = query.where(TuningSession.status == status)
        with self._read() as session:
            rows = [row_dict(row) for row in session.scalars(query)]
        return [self.with_pending_end(row) for row in rows]

    def get_session(self, session_id: int) -> dict[str, Any] | None:
        """One session as a dict (None if it does not exist); a running one whose worker is gone is marked
        interrupted first, one whose end waits for room on the disk reads 'stalled'."""
        found = self._get_session(session_id)
        if found is not None and found["status"] == "running" and self.look_for_orphans(only=session_id):
            found = self._get_session(session_id)
        return None if found is None else self.with_pending_end(found)

    def _get_session(self, session_id: int) -> dict[str, Any] | None:
        with self._read() as session:
            row = session.get(TuningSession, session_id)
            return row_dict(row) if row is not None else None

    def delete_session(self, session_id: int) -> bool:
        """Delete a session with its runs, steps, outputs and samples (database cascades); not while running."""
        with self._core() as conn:
            # Conditional delete: a worker claiming the session at this moment makes it 'running', not gone.
            stmt = delete(TuningSession).where(TuningSession.id == session_id, TuningSession.status != "running")
            if conn.execute(stmt).rowcount:
                return True
            if conn.scalar(select(TuningSession.status).where(TuningSession.id == session_id)) is None:
                return False
        raise StoreError(f"session {session_id} is running; cancel it before deleting it")

    def _update(self, session_id: int, **values: Any) -> None:
        with self._core() as conn:
            if not conn.execute(update(TuningSession).where(TuningSession.id == session_id).values(**values)).rowcount:
                raise StoreError(f"session {session_id} does not exist")

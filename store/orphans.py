"""Sessions whose worker is gone: found by heartbeat or pid, ended with their true cause, their runs closed.

A worker killed mid-session (SIGKILL, OOM, power loss) leaves its session 'running'. Whoever looks next — a
worker, `sessions`, the dashboard — marks it 'interrupted' with the reason, so it can be re-queued, and closes
the runs it left 'running'. A worker that could not write its session's end (the disk was full) leaves that end
pending, in memory and, when it can, in a small file beside the SQLite database (written whole or not at all);
until then readers show the session 'stalled' with that cause, and once writes are possible again the pending end
(e.g. "failed: disk full") is what the session gets, not "worker died".
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from store.base import StoreBase
from store.coltypes import utcnow as _utcnow
from store.db import sqlite_path
from store.errors import StoreError
from store.files import write_whole
from store.models import Run, TuningSession
from store.spill import endings_folder
from store.workers import parse_worker_id, worker_is_dead

log = logging.getLogger("spectune.store")

STALE_AFTER_S = 30.0  # a running session whose heartbeat is older than this has lost its worker
WORKER_DIED = "worker died"
STALLED = "stalled"  # shown, never stored: a running session whose end waits for room on the disk


def _stamp(moment: datetime | None) -> str:
    return "it started" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def died_reason(worker_id: str | None, last: datetime | None, dead: bool) -> str:
    """Why a session is judged orphaned, in words: the last heartbeat, and the vanished process if known."""
    reason = f"{WORKER_DIED} (no heartbeat since {_stamp(last)}"
    if dead:
        host, pid = parse_worker_id(worker_id) or ("?", 0)
        reason += f"; process {pid} on {host} is gone"
    return reason + ")"


class OrphansMixin(StoreBase):
    """Detection and closing of sessions whose worker is gone, and session ends left pending by a full disk."""

    def interrupt_orphaned_sessions(
        self, stale_after_s: float = STALE_AFTER_S, *, now: datetime | None = None, only: int | None = None
    ) -> list[int]:
        """Mark 'running' sessions whose worker is gone (stale heartbeat, or dead pid on this host) 'interrupted'.

        A session with a pending end (see `record_ending`) gets that end instead, at once. Each update re-checks the
        heartbeat it judged, so a worker that beats in between is left alone; the runs left 'running' are closed
        with the session. Returns the ids ended. `only` limits the check to one session."""
        now = now or _utcnow()
        cutoff = now - timedelta(seconds=stale_after_s)
        ended: list[int] = []
        for row in self._running_sessions(only):
            pending = self.pending_ending(row.id)  # its worker gave up writing it: it ends now, whatever the beat
            last = row.heartbeat_at or row.started_at
            dead = worker_is_dead(row.worker_id)
            if pending is None and not (dead or last is None or last < cutoff):
                continue
            status, error = pending or (
                "interrupted", f"{died_reason(row.worker_id, last, dead)}; what it measured is kept "
                f"(requeue: python -m engine requeue --session {row.id})",
            )  # fmt: skip
            if self._end_orphan(row.id, row.heartbeat_at, status, error, now, any_beat=pending is not None):
                ended.append(row.id)
        return ended

    def look_for_orphans(self, only: int | None = None) -> list[int]:
        """`interrupt_orphaned_sessions` for a reader (a listing, a page): never raises, nothing on a read-only
        store."""
        if self.read_only:
            return []
        try:
            return self.interrupt_orphaned_sessions(only=only)
        except StoreError as exc:
            log.warning("could not check for sessions whose worker died: %s", exc)
            return []

    def close_open_runs(self, session_id: int, status: str, error: str | None = None) -> int:
        """Every run of the session still 'running' gets ``status`` (with ``error`` in its summary); returns how
        many."""
        values: dict[str, Any] = {"status": status}
        if error is not None:
            values["summary"] = {"error": error}
        with self._core() as conn:
            stmt = update(Run).where(Run.session_id == session_id, Run.status == "running").values(**values)
            return conn.execute(stmt).rowcount

    def record_ending(self, session_id: int, status: str, error: str) -> None:
        """Remember a session end that could not be written (the disk is full): in memory, and in a file beside
        the database when one can be written, for whichever process can write it later."""
        self._endings()[session_id] = (status, error)
        path = self._ending_file(session_id)
        if path is None:
            return
        try:  # written whole (synced, then renamed into place) or not at all: never an empty or partial file
            path.parent.mkdir(exist_ok=True)
            write_whole(path, json.dumps({"status": status, "error": error}).encode("utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("session %s: could not note its end (%s) beside the database: %s", session_id, error, exc)

    def pending_ending(self, session_id: int) -> tuple[str, str] | None:
        """The (status, error) recorded for a session whose end could not be written, or None."""
        if session_id in self._endings():
            return self._endings()[session_id]
        path = self._ending_file(session_id)
        try:
            data = json.loads(path.read_text()) if path is not None and path.exists() else None
        except (OSError, ValueError):
            return None
        return (str(data["status"]), str(data["error"])) if isinstance(data, dict) and "status" in data else None

    def with_pending_end(self, row: dict[str, Any]) -> dict[str, Any]:
        """A session row as readers show it: a running session whose end could not be written (the disk is full)
        reads 'stalled', with that end's cause (kept in memory or beside the database) as its error."""
        if row.get("status") != "running":
            return row
        pending = self.pending_ending(int(row["id"]))
        if pending is None:
            return row
        status, error = pending
        return {**row, "status": STALLED, "error": f"{error} (to be written as {status} once the disk has room)"}

    def stalled_sessions(self) -> list[tuple[int, str]]:
        """(id, cause) of each running session whose end waits for room on the disk, read from what its worker
        kept beside the database (or in this process); nothing is written."""
        pending = self._pending_ids()
        if not pending:
            return []
        query = select(TuningSession.id).where(TuningSession.id.in_(pending), TuningSession.status == "running")
        with self._read() as session:
            running = set(session.scalars(query))
        return [(sid, ending[1]) for sid in pending if sid in running and (ending := self.pending_ending(sid))]

    def settle_endings(self) -> list[int]:
        """Write every pending end whose session is still 'running' (the disk has room again); returns the ids
        settled. Raises StoreError while writes still fail."""
        settled: list[int] = []
        for session_id in self._pending_ids():
            ending = self.pending_ending(session_id)
            if ending is not None and self._end_orphan(session_id, None, *ending, _utcnow(), any_beat=True):
                settled.append(session_id)
            self._forget_ending(session_id)
        return settled

    def _running_sessions(self, only: int | None) -> list[Any]:
        query = select(
            TuningSession.id, TuningSession.worker_id, TuningSession.heartbeat_at, TuningSession.started_at
        ).where(TuningSession.status == "running")
        if only is not None:
            query = query.where(TuningSession.id == only)
        with self._read() as session:
            return list(session.execute(query).all())

    def _end_orphan(
        self, session_id: int, beat: datetime | None, status: str, error: str, now: datetime, any_beat: bool = False
    ) -> bool:
        """End one running session (unless its heartbeat moved since it was judged) and close its open runs."""
        stmt = update(TuningSession).where(TuningSession.id == session_id, TuningSession.status == "running")
        if not any_beat:
            stmt = stmt.where(TuningSession.heartbeat_at.is_not_distinct_from(beat))
        with self._core() as conn:
            if not conn.execute(stmt.values(status=status, error=error, finished_at=now, phase=None)).rowcount:
                return False
        self.close_open_runs(session_id, "failed" if status == "failed" else "cancelled", error)
        self._forget_ending(session_id)
        return True

    def _endings(self) -> dict[int, tuple[str, str]]:
        return self.__dict__.setdefault("_pending_endings", {})

    def _endings_dir(self) -> Path | None:
        path = sqlite_path(self.engine.url)
        return None if path is None else endings_folder(path)

    def _ending_file(self, session_id: int) -> Path | None:
        folder = self._endings_dir()
        return None if folder is None else folder / f"{session_id}.json"

    def _pending_ids(self) -> list[int]:
        ids = set(self._endings())
        folder = self._endings_dir()
        if folder is not None and folder.is_dir():
            ids.update(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())
        return sorted(ids)

    def _forget_ending(self, session_id: int) -> None:
        self._endings().pop(session_id, None)
        path = self._ending_file(session_id)
        if path is not None:
            path.unlink(missing_ok=True)

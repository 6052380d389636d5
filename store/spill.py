"""A session carried out of a database deleted under its worker, and replayed into the next one at that path.

When the SQLite file a worker writes is deleted, moved or replaced, the worker stops, and what the file held is
saved whole beside the path (store.recovery.save_open_copy). The session it was running is also *spilled*: its
row, prompt set, runs, steps, outputs, utilisation samples and endpoint requests, read from that saved copy and
written whole (synced, then renamed) as ``<database>-endings/session-N.spill.json``.

The next store that opens a sound, writable database at the path (a new one, or a backup put in place) replays
each spill in one transaction:
- the prompt set is matched by its content hash, or added;
- a session with the same id and creation time (a backup taken while it ran) has its runs replaced by the
  spilled ones; any other session keeps its id, and the spilled one gets a new id;
- the session ends 'interrupted', saying where it came from, so `requeue` resumes it from what it measured.

A spill is claimed by renaming it before it is read, so two processes opening the store never replay it twice;
a claim whose process died is taken back. A store that still holds the old file never replays.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Table, create_engine, delete, select, update
from sqlalchemy.engine import Connection

from store.base import StoreBase
from store.coltypes import UTCDateTime
from store.coltypes import utcnow as _utcnow
from store.db import sqlite_path
from store.errors import StoreError
from store.files import write_whole
from store.models import (
    EndpointRequest,
    Output,
    Prompt,
    PromptSet,
    Run,
    Step,
    TuningSession,
    UtilisationSample,
)
from store.workers import pid_alive

log = logging.getLogger("spectune.store")

SPILL_FORMAT = 1
CLAIMED = ".replaying-"  # a claimed spill: <name><CLAIMED><pid>


def endings_folder(database: Path) -> Path:
    """The folder beside a SQLite database where a worker leaves what it could not write into it."""
    return database.with_name(database.name + "-endings")


def spill_path(database: Path, session_id: int) -> Path:
    """Where the spill of ``session_id`` from ``database`` is written."""
    return endings_folder(database) / f"session-{session_id}.spill.json"


# ---- writing a spill ----------------------------------------------------------------------------------------


def spill_session(copy: Path, database: Path, session_id: int) -> Path | None:
    """Spill session ``session_id`` as the saved ``copy`` of ``database`` holds it; the spill's path, or None when
    the copy holds no such session. Raises OSError when it cannot be written (nothing partial is left)."""
    rows = _read_session(copy, session_id)
    if rows is None:
        return None
    payload = {"format": SPILL_FORMAT, "database": str(database), "session_id": session_id,
               "spilled_at": _utcnow().isoformat(), "tables": rows}  # fmt: skip
    target = spill_path(database, session_id)
    target.parent.mkdir(exist_ok=True)
    write_whole(target, json.dumps(payload).encode("utf-8"))
    return target


def _read_session(copy: Path, session_id: int) -> dict[str, list[dict[str, Any]]] | None:
    """Every row of one session in a SQLite file (opened read-only), as JSON-ready dicts per table."""
    engine = create_engine(f"sqlite:///file:{copy}?mode=ro&uri=true")
    try:
        with engine.connect() as conn:
            session = _rows(conn, TuningSession.__table__, TuningSession.id == session_id)
            if not session:
                return None
            set_id = session[0]["prompt_set_id"]
            runs = _rows(conn, Run.__table__, Run.session_id == session_id)
            run_ids = [r["id"] for r in runs]
            return {
                "prompt_sets": _rows(conn, PromptSet.__table__, PromptSet.id == set_id),
                "prompts": _rows(conn, Prompt.__table__, Prompt.prompt_set_id == set_id),
                "sessions": session,
                "runs": runs,
                "steps": _rows(conn, Step.__table__, Step.run_id.in_(run_ids)),
                "outputs": _rows(conn, Output.__table__, Output.run_id.in_(run_ids)),
                "utilisation_samples": _rows(conn, UtilisationSample.__table__,
                                             UtilisationSample.session_id == session_id),
                "endpoint_requests": _rows(conn, EndpointRequest.__table__, EndpointRequest.session_id == session_id),
            }  # fmt: skip
    finally:
        engine.dispose()


def _rows(conn: Connection, table: Any, where: Any) -> list[dict[str, Any]]:
    """The rows of ``table`` matching ``where``, timestamps as ISO text, ordered by id."""
    result = conn.execute(select(table).where(where).order_by(table.c.id))
    return [{k: v.isoformat() if isinstance(v, datetime) else v for k, v in row._mapping.items()} for row in result]


# ---- replaying spills ---------------------------------------------------------------------------------------


class SpillMixin(StoreBase):
    """Replays sessions spilled from a database deleted under its worker into this one."""

    def spill_from_copy(self, copy: Path, session_id: int) -> Path | None:
        """Spill ``session_id`` as ``copy`` (this store's deleted or replaced file, saved) holds it, for the next
        database at this path; the spill's path, or None (not a SQLite store, no such session, or it cannot be
        written: said in the log)."""
        database = sqlite_path(self.engine.url)
        if database is None:
            return None
        try:
            return spill_session(copy, database, session_id)
        except (OSError, ValueError) as exc:
            log.error("could not spill session %s beside %s: %s", session_id, self.where, exc)
            return None

    def replay_spills(self) -> list[tuple[int, int]]:
        """Replay every spill waiting beside this database; (id in the deleted file, id here) of each session
        replayed. Nothing happens on a read-only, damaged or server database, nor in a store whose file is no
        longer the one at its path. Never raises: a spill that cannot be replayed stays for the next open."""
        database = sqlite_path(self.engine.url)
        if database is None or self.read_only or self.damage is not None or self.replaced() is not None:
            return []
        folder = endings_folder(database)
        if not folder.is_dir():
            return []
        replayed = []
        for spill in _waiting_spills(folder):
            claimed = _claim(spill)
            if claimed is None:
                continue
            try:
                replayed.append(self._replay(json.loads(claimed.read_text()), spill.name))
            except (OSError, ValueError, KeyError, StoreError) as exc:
                log.warning("could not replay %s into %s (kept for the next open): %s", spill, self.where, exc)
                _unclaim(claimed, spill)
                continue
            claimed.unlink(missing_ok=True)
            log.warning("replayed session %s of a deleted database into %s as session %s", replayed[-1][0],
                        self.where, replayed[-1][1])  # fmt: skip
        return replayed

    def follow_replacement(self) -> bool:
        """As StoreBase's, and the spills waiting beside the file now followed are replayed into it."""
        followed = super().follow_replacement()
        if followed:
            self.replay_spills()
        return followed

    def _replay(self, spill: dict[str, Any], name: str) -> tuple[int, int]:
        """One spill's rows in one transaction; (old id, new id)."""
        if spill.get("format") != SPILL_FORMAT:
            raise ValueError(f"unknown spill format {spill.get('format')!r}")
        tables = spill["tables"]
        old = tables["sessions"][0]
        with self._core() as conn:
            set_id = _prompt_set_id(conn, tables["prompt_sets"], tables["prompts"])
            new_id = _session_id(conn, old, set_id)
            runs = _insert_runs(conn, tables["runs"], new_id)
            _insert(conn, Step.__table__, tables["steps"], run_id=runs)
            _insert(conn, Output.__table__, tables["outputs"], run_id=runs)
            samples = [{**s, "run_id": runs.get(s["run_id"])} for s in tables["utilisation_samples"]]
            _insert(conn, UtilisationSample.__table__, samples, session_id={old["id"]: new_id})
            _insert(conn, EndpointRequest.__table__, tables["endpoint_requests"], session_id={old["id"]: new_id})
            open_runs = update(Run).where(Run.session_id == new_id, Run.status == "running")
            conn.execute(open_runs.values(status="cancelled"))
            conn.execute(update(TuningSession).where(TuningSession.id == new_id).values(
                status="interrupted", phase=None, cancel_requested=False, finished_at=_finished(old),
                error=_replayed_error(old, name, new_id, str(spill.get("database", "at this path"))),
            ))  # fmt: skip
        return int(old["id"]), new_id


def _waiting_spills(folder: Path) -> list[Path]:
    """The spills in ``folder`` not claimed by a live process (a dead one's claim is taken back first)."""
    for claimed in folder.glob(f"session-*.spill.json{CLAIMED}*"):
        pid = claimed.name.rsplit(CLAIMED, 1)[1]
        if not pid.isdigit() or not pid_alive(int(pid)):
            _unclaim(claimed, claimed.with_name(claimed.name.split(CLAIMED, 1)[0]))
    return sorted(folder.glob("session-*.spill.json"))


def _claim(spill: Path) -> Path | None:
    """Rename ``spill`` to this process's claim; None when another process took it first."""
    claimed = spill.with_name(f"{spill.name}{CLAIMED}{os.getpid()}")
    try:
        os.rename(spill, claimed)
    except FileNotFoundError:
        return None
    return claimed


def _unclaim(claimed: Path, spill: Path) -> None:
    try:
        os.rename(claimed, spill)
    except OSError as exc:
        log.warning("could not put back the spill %s: %s", claimed, exc)


def _prompt_set_id(conn: Connection, sets: list[dict[str, Any]], prompts: list[dict[str, Any]]) -> int | None:
    """The id here of the spilled session's prompt set: the one with its content hash, or the set added."""
    if not sets:
        return None
    spilled = sets[0]
    found = conn.execute(select(PromptSet.id).where(PromptSet.content_hash == spilled["content_hash"])).scalar()
    if found is not None:
        return int(found)
    new_id = int(conn.execute(PromptSet.__table__.insert().values(**_typed(PromptSet.__table__, spilled, id=None)))
                 .inserted_primary_key[0])  # fmt: skip
    _insert(conn, Prompt.__table__, prompts, prompt_set_id={spilled["id"]: new_id})
    return new_id


def _session_id(conn: Connection, old: dict[str, Any], set_id: int | None) -> int:
    """The session's id here: the same session found here (a backup taken while it ran) emptied of its runs, or a
    new row (its own id when that is free)."""
    table = TuningSession.__table__
    created = _typed(table, old)["created_at"]
    same = conn.execute(select(table.c.id, table.c.created_at).where(table.c.id == old["id"])).first()
    if same is not None and same.created_at is not None and same.created_at == created:
        conn.execute(delete(Run).where(Run.session_id == old["id"]))  # its steps and outputs go with it (ON DELETE)
        conn.execute(delete(UtilisationSample).where(UtilisationSample.session_id == old["id"]))
        conn.execute(delete(EndpointRequest).where(EndpointRequest.session_id == old["id"]))
        values = _typed(table, old, id=None, prompt_set_id=set_id)
        conn.execute(update(table).where(table.c.id == old["id"]).values(**values))
        return int(old["id"])
    keep_id = None if same is not None else old["id"]
    row = _typed(table, old, id=keep_id, prompt_set_id=set_id)
    return int(conn.execute(table.insert().values(**row)).inserted_primary_key[0])


def _insert_runs(conn: Connection, runs: list[dict[str, Any]], session_id: int) -> dict[int, int]:
    """Insert the spilled runs under ``session_id``; {old run id: new run id}."""
    table = Run.__table__
    mapping = {}
    for run in runs:
        row = _typed(table, run, id=None, session_id=session_id)
        mapping[int(run["id"])] = int(conn.execute(table.insert().values(**row)).inserted_primary_key[0])
    return mapping


def _insert(conn: Connection, table: Table, rows: list[dict[str, Any]], **remap: dict[int, int]) -> None:
    """Insert ``rows`` with new ids, each column named in ``remap`` translated through its {old: new} map."""
    if rows:
        typed = [_typed(table, r, id=None, **{c: m.get(r[c]) for c, m in remap.items()}) for r in rows]
        conn.execute(table.insert(), typed)


def _typed(table: Table, row: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A spilled row as the table takes it: timestamps parsed back, ``overrides`` applied (an id of None is
    left out, so the database gives one), columns the table no longer has dropped."""
    out: dict[str, Any] = {}
    for column in table.columns:
        value = overrides.get(column.key, row.get(column.key))
        if column.key == "id" and value is None:
            continue
        if isinstance(column.type, UTCDateTime) and isinstance(value, str):
            value = datetime.fromisoformat(value)
        out[column.key] = value
    return out


def _finished(old: dict[str, Any]) -> datetime:
    stamp = old.get("finished_at")
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else _utcnow()


def _replayed_error(old: dict[str, Any], name: str, new_id: int, database: str) -> str:
    """The replayed session's error line: what happened (the worker's own words, when it wrote them), where it
    came from, and the way on."""
    said = str(old.get("error") or "").split(";", 1)[0]
    why = said if said.startswith("database ") else f"database {database} was deleted or replaced while it ran"
    return (f"{why}; what it had measured was replayed here from {name} (session {old['id']} there); requeue: "
            f"python -m engine requeue --session {new_id}")  # fmt: skip

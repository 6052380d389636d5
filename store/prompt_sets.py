"""Prompt sets: uploaded prompt files, deduplicated by content so re-uploading is harmless."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from store.base import StoreBase, row_dict
from store.errors import StoreError
from store.models import Prompt, PromptSet

PromptInput = Mapping[str, Any] | str | Any  # a dict, a bare text, or an object with .text (engine.prompts.Prompt)


def text_hash(text: str) -> str:
    """sha256 of a prompt's text: its identity within a set."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def set_hash(prompts: Sequence[PromptInput]) -> str:
    """sha256 over the prompts' texts and categories in order: the identity of an uploaded file."""
    digest = hashlib.sha256()
    for item in prompts:
        text, category, _ = _fields(item)
        digest.update(json.dumps([text, category], ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _fields(item: PromptInput) -> tuple[str, str | None, int | None]:
    if isinstance(item, str):
        return item, None, None
    if isinstance(item, Mapping):
        return str(item["text"]), item.get("category"), item.get("token_count")
    return str(item.text), getattr(item, "category", None), getattr(item, "token_count", None)


class PromptSetsMixin(StoreBase):
    def add_prompt_set(
        self, name: str, source_filename: str | None, prompts: Sequence[PromptInput]
    ) -> tuple[int, int, int]:
        """Store an uploaded file's prompts; returns (prompt_set_id, added, duplicates).

        The same file uploaded again returns the existing set with added=0 (every prompt a duplicate);
        repeated prompts within one file are stored once and counted as duplicates.
        """
        if not prompts:
            raise StoreError(f"prompt set {name!r} has no prompts")
        self.refuse_new_work("storing prompts")
        digest = set_hash(prompts)
        for _ in range(2):  # a concurrent identical upload wins the unique hash; then we return its set
            existing = self._prompt_set_by_hash(digest)
            if existing is not None:
                return existing, 0, len(prompts)
            try:
                with self._write() as session:
                    prompt_set = PromptSet(name=name, source_filename=source_filename, content_hash=digest)
                    session.add(prompt_set)
                    session.flush()
                    added = self._insert_prompts(session, prompt_set, prompts)
                    return prompt_set.id, added, len(prompts) - added
            except IntegrityError:
                continue
        raise StoreError(f"prompt set {name!r} could not be stored (concurrent uploads kept conflicting)")

    def add_prompts(self, prompt_set_id: int, prompts: Sequence[PromptInput]) -> tuple[int, int]:
        """Append prompts to an existing set, skipping texts it already has; returns (added, duplicates)."""
        with self._write() as session:
            prompt_set = session.get(PromptSet, prompt_set_id)
            if prompt_set is None:
                raise StoreError(f"prompt set {prompt_set_id} does not exist")
            added = self._insert_prompts(session, prompt_set, prompts)
        return added, len(prompts) - added

    def list_prompt_sets(self) -> list[dict[str, Any]]:
        """All prompt sets, newest first."""
        with self._read() as session:
            rows = session.scalars(select(PromptSet).order_by(PromptSet.created_at.desc(), PromptSet.id.desc()))
            return [row_dict(row) for row in rows]

    def get_prompt_set(self, prompt_set_id: int) -> dict[str, Any] | None:
        with self._read() as session:
            row = session.get(PromptSet, prompt_set_id)
            return row_dict(row) if row is not None else None

    def get_prompts(self, prompt_set_id: int, limit: int | None = None) -> list[dict[str, Any]]:
        """A set's prompts in upload order (the first ``limit`` when given)."""
        query = select(Prompt).where(Prompt.prompt_set_id == prompt_set_id).order_by(Prompt.position).limit(limit)
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]

    def delete_prompt_set(self, prompt_set_id: int) -> bool:
        """Delete a set and its prompts; sessions that used it keep their results (prompt_set_id -> NULL)."""
        with self._write() as session:
            result = session.execute(delete(PromptSet).where(PromptSet.id == prompt_set_id))
            return bool(result.rowcount)

    def _prompt_set_by_hash(self, digest: str) -> int | None:
        with self._read() as session:
            return session.scalar(select(PromptSet.id).where(PromptSet.content_hash == digest))

    @staticmethod
    def _insert_prompts(session: Session, prompt_set: PromptSet, prompts: Sequence[PromptInput]) -> int:
        known = set(session.scalars(select(Prompt.content_hash).where(Prompt.prompt_set_id == prompt_set.id)))
        position = session.scalar(select(func.max(Prompt.position)).where(Prompt.prompt_set_id == prompt_set.id))
        position = -1 if position is None else position
        rows = []
        for item in prompts:
            text, category, token_count = _fields(item)
            digest = text_hash(text)
            if digest in known:
                continue
            known.add(digest)
            position += 1
            rows.append(
                Prompt(
                    prompt_set_id=prompt_set.id,
                    position=position,
                    text=text,
                    category=category,
                    content_hash=digest,
                    token_count=token_count,
                )
            )
        session.add_all(rows)
        prompt_set.n_prompts = (prompt_set.n_prompts or 0) + len(rows)
        return len(rows)

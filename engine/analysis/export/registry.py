"""The export formats: each declared by its own module as one ExportFormat record and registered here once."""

from __future__ import annotations

from engine.analysis.export import llamacpp, sglang, spectune, transformers, vllm
from engine.analysis.export.formats import ExportFormat

_REGISTERED: dict[str, ExportFormat] = {}


def register(fmt: ExportFormat) -> ExportFormat:
    """Offer a format everywhere formats are offered (the CLI, the pages, the report, every export call)."""
    if fmt.name in _REGISTERED and _REGISTERED[fmt.name] is not fmt:
        raise ValueError(f"an export format named {fmt.name!r} is registered already")
    _REGISTERED[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Withdraw a format (a test's own)."""
    _REGISTERED.pop(name, None)


def export_formats() -> tuple[ExportFormat, ...]:
    """Every registered format, in the order they were registered."""
    return tuple(_REGISTERED.values())


def format_names() -> tuple[str, ...]:
    return tuple(_REGISTERED)


def format_label(name: str) -> str:
    """A format's label; the bare name for one not offered any more (an export stored earlier)."""
    return _REGISTERED[name].label if name in _REGISTERED else name


def export_format(name: str) -> ExportFormat:
    """The format called `name`; ValueError naming the others when there is none."""
    if name not in _REGISTERED:
        raise ValueError(f"format must be one of {format_names()}, got {name!r}")
    return _REGISTERED[name]


for _module in (vllm, sglang, transformers, llamacpp, spectune):
    register(_module.FORMAT)

"""The session spec and its validation: refused with one clear message, in the UI and the CLI alike."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.core.engine_options import EngineOptions
from engine.core.policy import SpeculationPolicy, parse_policy
from engine.drafts.kinds import draft_kind
from engine.errors import SettingsError

MAX_GAMMA = 64


MAX_TEMPERATURE = 10.0
MAX_SEED = 2**63 - 1  # the store keeps a seed as a signed 64-bit integer
DEVICE_HELP = "auto, cpu or cuda[:N]"


# the spec fields kept in the sessions table's own columns; everything else travels in its options JSON
_COLUMNS = ("target", "drafts", "gammas", "temperatures", "max_new_tokens", "top_k", "top_p", "seed", "dtype", "device")
_OPTIONS = (
    "engine", "chat_template", "measure_verify_cost", "trust_remote_code", "detect_regime", "serving_batch",
    "prompt_sample", "policies", "concurrency", "mode", "confirm", "time_budget_s", "engine_options",
)  # fmt: skip
MODES = ("quick", "full")  # engine.session.quick: probe, predict, confirm; or every configuration of the grid
MAX_CONCURRENCY = 64


def _seconds(value: Any) -> float | None:
    """A stored number of seconds, or None."""
    return None if value is None else float(value)


_OPTIONS_TYPES: dict[str, type[EngineOptions]] = {}  # engine -> the type of its own options (its registry entry)


def register_engine_options(engine: str, options: type[EngineOptions]) -> None:
    """Sessions in `engine` hold options of type `options` (the engine registry registers each engine's once)."""
    _OPTIONS_TYPES[engine] = options


def stored_engine_options(engine: str, stored: Mapping[str, Any]) -> Mapping[str, Any]:
    """A stored session's own engine options as plain values ({} where none): its `engine_options`, or the key an
    older row of that engine kept them under."""
    older = _OPTIONS_TYPES[engine].stored_as if engine in _OPTIONS_TYPES else ""
    found = stored.get("engine_options") or (stored.get(older) if older else None)
    return found if isinstance(found, Mapping) else {}


def read_engine_options(engine: str, stored: Mapping[str, Any]) -> EngineOptions | Mapping[str, Any] | None:
    """A stored session's own engine options, typed by its engine (an engine not registered here: as stored)."""
    found = stored_engine_options(engine, stored)
    if engine in _OPTIONS_TYPES:
        return _OPTIONS_TYPES[engine].from_dict(found)
    return dict(found) or None


def session_engine(row: Mapping[str, Any]) -> str:
    """The engine a stored session measured with ("spectune", the PyTorch loop, for a row from before engines)."""
    return str((row.get("options") or {}).get("engine") or "spectune")


@dataclass
class SessionSpec:
    """Everything one session needs, built once by the page or the CLI and validated once.

    The sweep: the baseline (target alone) plus drafts × γ × temperatures. Engine options: chat template,
    the v(k) measurement, trust_remote_code. Regime options: whether to detect the regime afterwards and
    at which serving batch. `to_row()` gives the store's session columns (+ `options`); `from_row()` reads
    a stored session back into the same spec.
    """

    target: str
    drafts: list[str]
    gammas: list[int]
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 64
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "bfloat16"
    device: str = "auto"
    chat_template: bool = True
    measure_verify_cost: bool = True
    trust_remote_code: bool = False
    detect_regime: bool = True
    serving_batch: int = 1
    engine: str = "spectune"
    engine_options: EngineOptions | None = None  # the engine's own options, of its entry's type (None: none)
    prompt_sample: str = "first"  # "first" n in file order, or "stratified" by category (engine.session.sampling)
    policies: list[str] = field(default_factory=list)  # speculation policies also run live (engine.core.policy)
    concurrency: list[int] = field(default_factory=lambda: [1])  # requests in flight (engines that batch them)
    mode: str = "full"  # "quick": one probe run per draft, the grid predicted, the best confirmed live (MODES)
    confirm: bool = False  # full mode: the headline run live where the grid did not measure it (service.worker.sweeps)
    time_budget_s: float | None = None  # the time budget it was sized to (engine.service.sizing.budget); None: none

    def to_dict(self) -> dict:
        return asdict(self)

    def to_row(self) -> dict[str, Any]:
        """The sessions-table columns for this spec, with the rest under `options`."""
        data = self.to_dict()
        row = {key: data[key] for key in _COLUMNS}
        row["options"] = {key: data[key] for key in _OPTIONS}
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SessionSpec:
        """The spec a stored session was queued with (defaults for options an older row lacks)."""
        options = row.get("options") or {}
        defaults = cls(target="", drafts=[], gammas=[], engine=session_engine(row))
        return cls(
            target=row["target"],
            drafts=list(row["drafts"]),
            gammas=[int(g) for g in row["gammas"]],
            temperatures=[float(t) for t in row["temperatures"]],
            max_new_tokens=int(row["max_new_tokens"]),
            top_k=int(row.get("top_k") or 0),
            top_p=float(row.get("top_p") or 1.0),
            seed=int(row.get("seed") or 0),
            dtype=row.get("dtype") or defaults.dtype,
            device=row.get("device") or defaults.device,
            **{key: _option(key, options, defaults) for key in _OPTIONS},
        )


def _option(key: str, options: Mapping[str, Any], defaults: SessionSpec) -> Any:
    """One stored option as the spec's field takes it (the default when an older row lacks it)."""
    default = getattr(defaults, key)
    if key == "engine_options":
        return read_engine_options(defaults.engine, options)
    if key == "time_budget_s":
        return _seconds(options.get(key))
    return type(default)(options.get(key, default))


def validate(s: SessionSpec, n_prompts: int | None = None) -> SessionSpec:
    """The checks every engine that decodes a target shares: SettingsError naming the first bad field. Each engine
    adds its own (engine.engines.registry.validate runs both)."""
    if not s.target or not s.target.strip():
        raise SettingsError("no target model given")
    if not s.drafts:
        raise SettingsError("no draft given: name a draft model, 'ngram', or 'none' for the target alone")
    check_drafts(s.engine, s.drafts)
    parse_policies(s.policies)
    if not s.gammas and not s.policies:
        raise SettingsError("no γ given")
    for g in s.gammas:
        if not isinstance(g, int) or isinstance(g, bool):
            raise SettingsError(f"γ must be a whole number, got {g!r}")
        if g < 1:
            raise SettingsError(f"γ = {g} is out of range: the draft must propose at least 1 token")
        if g > MAX_GAMMA:
            raise SettingsError(f"γ = {g} is out of range: at most {MAX_GAMMA} draft tokens per step")
    for t in s.temperatures:
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise SettingsError(
                f"temperature {t!r} is not a finite number: use 0 for greedy decoding, up to {MAX_TEMPERATURE}"
            )
        if t < 0:
            raise SettingsError(f"temperature {t} is negative; use 0 for greedy decoding")
        if t > MAX_TEMPERATURE:
            raise SettingsError(f"temperature {t} is above {MAX_TEMPERATURE}")
    if s.max_new_tokens < 1:
        raise SettingsError(f"max new tokens = {s.max_new_tokens}: must be at least 1")
    if s.top_k < 0:
        raise SettingsError(f"top-k = {s.top_k}: must be 0 (off) or positive")
    if not 0 < s.top_p <= 1:
        raise SettingsError(f"top-p = {s.top_p}: must be in (0, 1]")
    if isinstance(s.seed, bool) or not isinstance(s.seed, int) or not 0 <= s.seed <= MAX_SEED:
        raise SettingsError(f"seed {s.seed}: a whole number from 0 to {MAX_SEED} (2^63 - 1)")
    check_device(s.device)
    if s.dtype not in ("float32", "bfloat16", "float16"):
        raise SettingsError(f"dtype '{s.dtype}': choose float32, bfloat16 or float16")
    if not 1 <= s.serving_batch <= 4096:
        raise SettingsError(f"serving batch = {s.serving_batch}: must be between 1 and 4096")
    if s.prompt_sample not in ("first", "stratified"):
        raise SettingsError(f"prompt sample '{s.prompt_sample}': choose first or stratified")
    if s.mode not in MODES:
        raise SettingsError(f"mode '{s.mode}': choose quick (probe, predict, confirm) or full (every configuration)")
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError("the prompt set is empty: upload or choose prompts first")
    validate_concurrency(s.concurrency)
    check_time_budget(s.time_budget_s)
    return s


def check_drafts(engine: str, drafts: list[str]) -> None:
    """Each draft well formed and of a kind `engine` runs (engine.drafts.kinds): SettingsError naming the first
    that is not."""
    for ref in drafts:
        kind = draft_kind(ref)
        if (why := kind.check(ref)) is not None:
            raise SettingsError(why)
        if (why := kind.refused_by(engine, ref)) is not None:
            raise SettingsError(why)


def check_time_budget(seconds: Any) -> None:
    """None, or a positive finite number of seconds: SettingsError otherwise."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
        raise SettingsError(f"time budget {seconds!r}: a positive number of seconds, or none")


def check_device(device: str) -> None:
    """auto, cpu or cuda[:N], and a CUDA device only where torch sees it: SettingsError saying which exist."""
    if device in ("auto", "cpu"):
        return
    match = re.fullmatch(r"cuda(?::(\d+))?", str(device))
    if match is None:
        raise SettingsError(f"device '{device}': choose {DEVICE_HELP}")
    import torch

    if not torch.cuda.is_available():
        raise SettingsError(
            f"device '{device}': no CUDA GPU is available here (torch {torch.__version__}); choose auto or cpu"
        )
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise SettingsError(
            f"device '{device}': this machine has {count} CUDA GPU{'s' if count != 1 else ''} "
            f"(cuda:0 to cuda:{count - 1})"
        )


def validate_concurrency(levels: list[int]) -> None:
    """Concurrency levels: whole numbers from 1 to MAX_CONCURRENCY, each once."""
    if not levels:
        raise SettingsError("no concurrency level given: use 1 for one request at a time")
    for n in levels:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CONCURRENCY:
            raise SettingsError(f"concurrency {n!r}: must be a whole number from 1 to {MAX_CONCURRENCY}")
    if len(set(levels)) != len(levels):
        raise SettingsError(f"concurrency levels {levels}: each level once")


def parse_policies(texts: list[str]) -> list[SpeculationPolicy]:
    """The policies of a spec, parsed; SettingsError naming the first that does not parse."""
    try:
        return [parse_policy(text) for text in texts]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def gammas_and_policies(s: SessionSpec) -> tuple[list[int], list[SpeculationPolicy]]:
    """The fixed γs to run (a fixed:G policy is γ = G) and the policies whose γ varies step by step."""
    policies = parse_policies(s.policies)
    gammas = sorted({*s.gammas, *(g for p in policies if (g := p.fixed_gamma()) is not None)})
    return gammas, [p for p in policies if p.fixed_gamma() is None]


def widest_draft(gammas: list[int], policies: list[SpeculationPolicy]) -> int:
    """The most tokens a step verifies, less one, that v(k) is measured for: the largest γ, and each policy's most
    drafted up to 16 (1 when there are neither)."""
    return max([*gammas, *(min(p.max_draft(), 16) for p in policies)], default=1)


def check_context(prompt_tokens: int, max_new_tokens: int, max_context: int, prompt_label: str) -> None:
    """A prompt plus its new tokens must fit the model context."""
    if max_new_tokens >= max_context:
        raise SettingsError(f"max new tokens = {max_new_tokens} is beyond the model context of {max_context} tokens")
    if prompt_tokens + max_new_tokens > max_context:
        raise SettingsError(
            f"{prompt_label}: {prompt_tokens} prompt tokens + {max_new_tokens} new tokens exceed the model "
            f"context of {max_context} tokens"
        )

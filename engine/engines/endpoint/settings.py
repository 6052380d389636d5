"""What an endpoint session targets and how hard it may push: validated once, refused with one clear line.

The API key is never part of these settings: only the *name* of the environment variable that holds it
(`api_key_env`), read when a request is sent. URLs are plain `scheme://host[:port][/path]`: credentials,
query strings and fragments are refused, so nothing secret is stored with a session or shown in the UI.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from engine.core.engine_options import EngineOptions
from engine.errors import SettingsError

ENGINE_KINDS = ("auto", "vllm", "sglang", "llama.cpp", "openai")  # openai: any other OpenAI-compatible server
APIS = ("completions", "chat")  # /v1/completions or /v1/chat/completions

# hard caps: a sweep can never exceed these, whatever the UI or CLI asks for
MAX_CONCURRENCY = 64
MAX_LEVELS = 16
MAX_REQUESTS_PER_LEVEL = 5000
MAX_LEVEL_DURATION_S = 1800.0
MAX_REQUEST_TIMEOUT_S = 600.0
MAX_NEW_TOKENS = 32768
MAX_RETRIES = 5
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def normalize_url(url: str, what: str = "endpoint URL") -> str:
    """`scheme://host[:port][/prefix]` without a trailing `/` or `/v1`: the root every path is joined to."""
    raw = (url or "").strip()
    if not raw:
        raise SettingsError(f"no {what} given")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https"):
        raise SettingsError(f"{what} '{raw}': must start with http:// or https://")
    if not parts.hostname:
        raise SettingsError(f"{what} '{raw}': no host")
    if parts.username or parts.password:
        raise SettingsError(f"{what}: credentials in the URL are refused; put the API key in an environment variable")
    if parts.query or parts.fragment:
        raise SettingsError(f"{what} '{parts.scheme}://{parts.netloc}{parts.path}…': no query string or fragment")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise SettingsError(f"{what} '{raw}': {exc}") from exc
    path = parts.path.rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_env_name(name: str) -> str:
    name = (name or "").strip()
    if name and not _ENV_NAME.match(name):
        raise SettingsError(f"API key variable '{name}': give the *name* of an environment variable (A-Z, 0-9, _)")
    return name


def api_key(env_name: str) -> str | None:
    """The key from the environment variable named in the session (None when no variable is named)."""
    if not env_name:
        return None
    value = os.environ.get(env_name)
    if not value:
        raise SettingsError(f"the API key variable {env_name} is not set in the environment of this process")
    return value


def parse_levels(text: str | list[int] | tuple[int, ...]) -> list[int]:
    """`"1,2,4,8"` (or a list) → sorted distinct concurrency levels, each 1..MAX_CONCURRENCY."""
    items = text if isinstance(text, list | tuple) else [p for p in re.split(r"[,\s]+", str(text)) if p]
    levels: list[int] = []
    for item in items:
        try:
            level = int(item)
        except (TypeError, ValueError):
            raise SettingsError(f"concurrency '{item}': must be a whole number") from None
        if not 1 <= level <= MAX_CONCURRENCY:
            raise SettingsError(f"concurrency {level} is out of range: 1 to {MAX_CONCURRENCY}")
        levels.append(level)
    if not levels:
        raise SettingsError("no concurrency levels given (e.g. 1,2,4,8)")
    if len(set(levels)) > MAX_LEVELS:
        raise SettingsError(f"{len(set(levels))} concurrency levels: at most {MAX_LEVELS}")
    return sorted(set(levels))


@dataclass
class Endpoint:
    """One server to drive: its root URL, the model it serves, its engine and which API to call."""

    url: str
    model: str = ""  # empty: the first model the server lists at /v1/models (or none sent)
    api_key_env: str = ""  # the *name* of the variable holding the key; "" = no key
    kind: str = "auto"
    api: str = "completions"
    label: str = "speculative"  # how results name it: "speculative" or "baseline"

    def __post_init__(self) -> None:
        self.url = normalize_url(self.url, f"{self.label} endpoint URL")
        self.api_key_env = check_env_name(self.api_key_env)
        self.model = (self.model or "").strip()
        if self.kind not in ENGINE_KINDS:
            raise SettingsError(f"engine kind '{self.kind}': choose one of {', '.join(ENGINE_KINDS)}")
        if self.api not in APIS:
            raise SettingsError(f"API '{self.api}': choose completions or chat")


@dataclass
class SweepLimits:
    """How a sweep runs and where it stops: per level, at most `max_requests` (whole rounds of `concurrency`
    requests) and `max_duration_s`."""

    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    max_requests: int = 32
    max_duration_s: float = 120.0
    max_new_tokens: int = 64
    temperature: float = 0.0
    request_timeout_s: float = 60.0
    max_retries: int = 2  # per request, for 429 and 503 only
    max_consecutive_errors: int = 3  # the first run of this many failed requests stops the sweep
    warmup_requests: int = 1  # sent before the first level, not counted
    ignore_eos: bool = False  # ask vLLM/SGLang/llama.cpp for exactly max_new_tokens tokens

    def __post_init__(self) -> None:
        self.concurrency = parse_levels(self.concurrency)
        if not 1 <= self.max_requests <= MAX_REQUESTS_PER_LEVEL:
            raise SettingsError(f"max requests per level = {self.max_requests}: 1 to {MAX_REQUESTS_PER_LEVEL}")
        if not 0 < self.max_duration_s <= MAX_LEVEL_DURATION_S:
            raise SettingsError(
                f"max seconds per level = {self.max_duration_s:g}: above 0, at most {MAX_LEVEL_DURATION_S:g}"
            )
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise SettingsError(f"max new tokens = {self.max_new_tokens}: 1 to {MAX_NEW_TOKENS}")
        if not 0 <= self.temperature <= 10:
            raise SettingsError(f"temperature {self.temperature}: 0 to 10")
        if not 0 < self.request_timeout_s <= MAX_REQUEST_TIMEOUT_S:
            raise SettingsError(
                f"request timeout = {self.request_timeout_s:g} s: above 0, at most {MAX_REQUEST_TIMEOUT_S:g}"
            )
        if not 0 <= self.max_retries <= MAX_RETRIES:
            raise SettingsError(f"retries = {self.max_retries}: 0 to {MAX_RETRIES}")
        if not 1 <= self.max_consecutive_errors <= 100:
            raise SettingsError(f"errors in a row before stopping = {self.max_consecutive_errors}: 1 to 100")
        if not 0 <= self.warmup_requests <= 8:
            raise SettingsError(f"warm-up requests = {self.warmup_requests}: 0 to 8")
        if self.max_requests < max(self.concurrency):
            raise SettingsError(
                f"max requests per level = {self.max_requests} is below concurrency "
                f"{max(self.concurrency)}: a level needs at least one round of that many requests"
            )


@dataclass
class EndpointSessionSettings(EngineOptions):
    """An endpoint session's own options, as its spec holds them (plain JSON values).

    `baseline_url` is an optional second endpoint serving the same model without speculation: both are
    driven at every level, so speedup, goodput and the regime flip come from measurements side by side.
    The latency target (`ttft_slo_s`, `tpot_slo_s`; 0 = none) defines goodput.
    """

    stored_as = "endpoint"

    url: str
    model: str = ""
    api_key_env: str = ""
    kind: str = "auto"
    api: str = "completions"
    baseline_url: str = ""
    baseline_model: str = ""
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    max_requests: int = 32
    max_duration_s: float = 120.0
    request_timeout_s: float = 60.0
    ignore_eos: bool = False
    ttft_slo_s: float = 0.0
    tpot_slo_s: float = 0.0
    warmup_requests: int = 1
    max_retries: int = 2
    max_consecutive_errors: int = 3

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | EndpointSessionSettings | None) -> EndpointSessionSettings:
        if isinstance(data, EndpointSessionSettings):
            return data
        data = data or {}
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SettingsError(f"unknown endpoint settings: {', '.join(unknown)}")
        if "url" not in known:
            raise SettingsError("no endpoint URL given")
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def endpoints(self) -> list[Endpoint]:
        """The endpoint under test, then the baseline (if any); raises SettingsError for a bad one."""
        found = [Endpoint(self.url, self.model, self.api_key_env, self.kind, self.api, "speculative")]
        if self.baseline_url.strip():
            found.append(
                Endpoint(
                    self.baseline_url,
                    self.baseline_model or self.model,
                    self.api_key_env,
                    self.kind,
                    self.api,
                    "baseline",
                )
            )
        return found

    def limits(self, max_new_tokens: int, temperature: float) -> SweepLimits:
        return SweepLimits(
            concurrency=list(self.concurrency),
            max_requests=int(self.max_requests),
            max_duration_s=float(self.max_duration_s),
            max_new_tokens=int(max_new_tokens),
            temperature=float(temperature),
            request_timeout_s=float(self.request_timeout_s),
            ignore_eos=bool(self.ignore_eos),
            warmup_requests=int(self.warmup_requests),
            max_retries=int(self.max_retries),
            max_consecutive_errors=int(self.max_consecutive_errors),
        )

    def checked(self, spec: Any) -> EndpointSessionSettings:
        """Checked for a session decoding `spec.max_new_tokens` at its first temperature."""
        return self.validate(spec.max_new_tokens, (spec.temperatures or [0.0])[0])

    def validate(self, max_new_tokens: int = 64, temperature: float = 0.0) -> EndpointSessionSettings:
        """Check everything and normalise in place (URL roots, variable name, levels); returns self."""
        self.concurrency = parse_levels(self.concurrency)
        found = self.endpoints()
        self.url, self.model, self.api_key_env = found[0].url, found[0].model, found[0].api_key_env
        self.baseline_url = found[1].url if len(found) > 1 else ""
        self.limits(max_new_tokens, temperature)
        for name in ("ttft_slo_s", "tpot_slo_s"):
            value = float(getattr(self, name))
            if not 0 <= value <= 3600:
                raise SettingsError(f"latency target {name} = {value:g} s: 0 (none) to 3600")
        return self

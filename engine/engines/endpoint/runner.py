"""A running OpenAI-compatible deployment as a session engine: no local model, draft or γ of ours; its settings.

Its plan is the endpoint under test "as deployed" (and, when one is given, a baseline endpoint serving the same
model without speculation) at each concurrency level of its settings. For each prompt the one sweep driver asks
for a round: the prompt and the next concurrency − 1 sent at once (engine.engines.endpoint.rounds), every request stored
as it finishes, tokens/s over the round, acceptance from the server's /metrics difference over exactly that round
(else what the responses said). A level stops at its request or time cap; a fatal failure or a run of failed
requests stops the session with one message, keeping everything measured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from engine.analysis.prediction import DraftingLoop
from engine.core.counters import SpecCounters
from engine.core.records import Cancelled, PromptOutput
from engine.engines.endpoint.report import sweep_report
from engine.engines.endpoint.results import RequestResult, SweepResult
from engine.engines.endpoint.rounds import EndpointClient, Round
from engine.engines.endpoint.settings import EndpointSessionSettings
from engine.errors import SettingsError, SpectuneError
from engine.measure.fidelity import TargetTop
from engine.models.pool import ModelPool
from engine.serving.transport import EndpointError
from engine.session.runner import DecodeContext, Decoded, EngineOutputs, Enough, PromptText, RunKey
from engine.session.spec import SessionSpec


def validate_endpoint(s: SessionSpec, n_prompts: int | None = None) -> None:
    """The endpoint's settings and caps instead of a model's."""
    if s.max_new_tokens < 1:
        raise SettingsError(f"max new tokens = {s.max_new_tokens}: must be at least 1")
    if s.policies:
        raise SettingsError("speculation policies run in spectune's loop and llama.cpp: choose one of those engines")
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError("the prompt set is empty: upload or choose prompts first")


def plan_endpoint(spec: SessionSpec, levels: Sequence[int] = (1,)) -> list[RunKey]:
    """The baseline endpoint (if any), then the endpoint under test as deployed (γ 0: its own), at each of its
    settings' concurrency levels and the session's temperature."""
    settings = EndpointSessionSettings.of(spec)
    temperatures = spec.temperatures or [0.0]
    plan = [RunKey("none", 0, t, None, n) for n in settings.concurrency for t in temperatures if settings.baseline_url]
    return plan + [RunKey(settings.url, 0, t, None, n) for n in settings.concurrency for t in temperatures]


def _counters(rnd: Round) -> SpecCounters:
    """The round's counters: the server's difference where it counts drafts, else the responses' own figures,
    else no target calls counted (tokens per call unknown)."""
    ok = rnd.ok
    emitted = sum(r.output_tokens for r in ok)
    if rnd.counters is not None and rnd.counters.speculates and rnd.counters.drafts is not None:
        return rnd.counters.as_spec(emitted)
    said = [r for r in ok if r.draft_n is not None]
    if not said:
        return SpecCounters(emitted=float(emitted))
    accepted = float(sum(r.draft_n_accepted or 0 for r in said))
    verify = sum(r.verify_calls or 0 for r in said)
    return SpecCounters(
        drafts=float(verify),
        draft_tokens=float(sum(r.draft_n or 0 for r in said)),
        accepted_tokens=accepted,
        target_calls=max(emitted - accepted, 1.0 if emitted else 0.0),
        emitted=float(emitted),
    )


class EndpointRunner:
    """A running deployment (and its optional baseline) behind the Runner interface."""

    name: ClassVar[str] = "endpoint"
    unavailable: ClassVar[tuple[str, ...]] = (
        "alpha",
        "beta_per_position",
        "from_draft",
        "verify_cost",
        "c",
        "fidelity",
    )
    drafting_loop: ClassVar[DraftingLoop] = DraftingLoop()
    device = "remote"
    dtype = "as served"

    def __init__(self, pool: ModelPool | None = None) -> None:
        """`pool` is not used: the models live in the deployment."""
        self.settings: EndpointSessionSettings | None = None
        self.clients: dict[str, EndpointClient] = {}
        self.prompts: list[PromptText] = []

    @property
    def stopped(self) -> str | None:
        return next((c.stopped for c in self.clients.values() if c.stopped), None)

    def _client(self, key: RunKey) -> EndpointClient:
        return self.clients["baseline" if key.kind == "baseline" else "speculative"]

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        """Connect to each endpoint (its engine, version, model); one that cannot be reached stops the session."""
        temperature = (spec.temperatures or [0.0])[0]
        self.settings = EndpointSessionSettings.of(spec).validate(spec.max_new_tokens, temperature)
        limits = self.settings.limits(spec.max_new_tokens, temperature)
        self.clients = {e.label: EndpointClient(e, limits) for e in self.settings.endpoints()}
        self.prompts = list(prompts)
        for i, client in enumerate(self.clients.values()):
            ctx.phase(f"connecting to the {client.label} endpoint", i, len(self.clients), None)
            try:
                client.connect()
            except (EndpointError, SpectuneError) as exc:
                client.stop(f"{client.label} endpoint: {exc}")
                break
        return {key: self.stopped for key in plan if self.stopped}

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        return {}, ["v(k) not measured: a deployment serves whole requests, it has no single-forward timing"]

    def warm_up(self, plan: list[RunKey]) -> None:
        for client in self.clients.values():
            if self.stopped:
                return
            try:
                client.warm_up([p.text for p in self.prompts])
            except EndpointError as exc:
                client.stop(f"{client.label} endpoint: {exc}")

    def prime(self, index: int, ctx: DecodeContext) -> None:
        """Nothing more: the warm-up already sent every prompt once to every endpoint, untimed."""

    def reference_at(self, index: int, prefix: Sequence[int]) -> TargetTop | None:
        """None: a deployment's outputs are not judged for fidelity (its requests are capped)."""
        return None

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        """Prompt `index` with the next concurrency − 1 prompts in flight; a round with no successful request is
        sent again until one succeeds or the error rules stop the endpoint. The A/A check (the target alone without
        `reference`) is declined: a deployment's requests are capped, and the check would spend them."""
        if key.kind == "baseline" and not reference:
            raise Enough("a deployment's requests are capped: no A/A check")
        client = self._client(key)
        n = len(self.prompts)
        batch = [((index + j) % n, self.prompts[(index + j) % n].text) for j in range(key.concurrency)]
        while True:
            if self.stopped:
                raise Enough(self.stopped)
            capped = client.capped(key.concurrency)
            if capped:
                raise Enough(capped)
            rnd = client.round(key.concurrency, batch, key.temperature, ctx.should_stop)
            ctx.on_requests([r.row() for r in rnd.requests])
            if ctx.should_stop():
                raise Cancelled()
            if rnd.ok:
                return self._decoded(rnd, index, ctx)

    def _decoded(self, rnd: Round, index: int, ctx: DecodeContext) -> Decoded:
        ok: list[RequestResult] = rnd.ok
        counters = _counters(rnd)
        ctx.on_step(counters.step_record(index, rnd.wall_s))
        mine = next((r for r in ok if r.prompt_index == index), ok[0])
        output = PromptOutput(
            prompt_index=index,
            prompt_id=self.prompts[index].prompt_id,
            prompt_tokens=0,
            token_ids=[],
            text=mine.text,
            from_draft=[],
            wall_time_s=mine.duration_s,
            steps=int(counters.target_calls),
            prefill_time_s=mine.ttft_s or 0.0,
        )
        return Decoded(
            output,
            counters,
            rnd.wall_s,
            tokens=int(counters.emitted),
            ttft_s=[r.ttft_s for r in ok if r.ttft_s is not None],
            itl_s=[g for r in ok for g in r.itl_s],
        )

    def side_measure(self, index: int) -> None:
        pass

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        urls = ", ".join(c.endpoint.url for c in self.clients.values())
        warnings = [f"{c.label} endpoint: {w}" for c in self.clients.values() for w in c.run.warnings]
        return EngineOutputs(notes=warnings, stopped=self.stopped, hardware=f"remote endpoint: {urls}")

    def describe(self) -> dict[str, Any]:
        """The sweep report the Endpoints page and `probe` read: per endpoint and level, and the comparison."""
        if self.settings is None:
            return {}
        result = SweepResult([c.measured() for c in self.clients.values()], stopped=self.stopped)
        return {"endpoint": sweep_report(result, self.settings.ttft_slo_s, self.settings.tpot_slo_s)}

    def stop(self) -> None:
        """Cut any retry's back-off short; a round's threads end with their requests (each bounded by its timeout)."""
        for client in self.clients.values():
            client.wake.set()

"""Adaptive data-reduction policies: which codec level to send this step (DESIGN.md §5).

Every policy is a small synchronous state machine behind one interface: `choose()` takes the
link snapshot, the dense payload size and the measured compute time and returns a `Decision`;
`observe()` feeds back what the send really cost. No clocks are read here (time arrives in
`LinkState.time_s` or as an argument), so policies run on synthetic sequences in tests.

Policies register by name like codecs do; `make_policy("netsense", ladder, eps=0.2)` or
`make_policy("fixed:topk:0.01+fp16", ladder)` build them. docs/POLICIES.md states every law.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar

from netsense.errors import ConfigError

from .costs import CodecCosts, TransportCost
from .ladder import Ladder, Level, level_for
from .link import LinkState
from .progress import DEFAULT_SAMPLE_NUMEL, ProgressEstimate

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What a policy chose for one step, with the prediction it was based on."""

    level: int | None
    """Index into the policy's ladder, or None when `spec` is not a ladder level (paper law, fixed)."""
    spec: str
    """Codec spec to encode this step with; `make_codec(spec)` builds it."""
    predicted_comm_s: float | None
    """Predicted communication time T_l (s), None while bandwidth is unknown."""
    predicted_step_s: float | None
    """Predicted step time P_l (s): compute plus or overlapped with T_l; None while unknown."""
    reason: str
    """Why: a leading keyword (``law``, ``heavier``, ``relax``, ``hold``, ``probe``, ``warm-up``,
    ``unknown-bandwidth``, ``fixed``, ``paper``, ``dc2``) and short details."""
    step: int
    """Training step the decision is for."""
    payload_bytes: int
    """Dense fp32 bytes the decision was made for (S)."""
    predicted_bytes: int
    """Predicted wire bytes at the chosen level (r_l * S)."""
    compute_s: float
    """Compute time (Tc) the prediction used."""
    overlap: bool
    """Whether communication was assumed to overlap compute."""
    bandwidth_Bps: float | None = None
    """Effective bandwidth (bytes/s) the prediction used, after queue and loss shrinkage."""
    policy: str = ""
    """Spec of the policy that decided, e.g. ``"netsense"``."""
    progress: float | None = None
    """Progress efficiency q of the chosen level the decision assumed (netsense), else None."""
    progress_levels: tuple[float, ...] | None = None
    """q of every ladder level at decision time (netsense), else None."""
    predicted_levels: tuple[float, ...] | None = None
    """P_l of every ladder level the law compared (netsense; inf where a level was excluded), so a
    log shows why a level won: its cost is P_l / q_l. None when no prediction was made."""
    per_byte_s: float | None = None
    """Measured transport seconds per wire byte (c) the predictions used; 0 while unknown."""

    def to_record(
        self, link: LinkState, *, bytes_sent: int | None = None, comm_s: float | None = None
    ) -> dict[str, Any]:
        """One JSON-safe decision-log line (non-finite floats become null), for JSONL files.

        `bytes_sent` and `comm_s` are what the send really cost, when the caller logs after it.
        """
        rec: dict[str, Any] = {
            "t": link.time_s,
            "step": self.step,
            "policy": self.policy,
            "level": self.level,
            "spec": self.spec,
            "reason": self.reason,
            "payload_bytes": self.payload_bytes,
            "predicted_bytes": self.predicted_bytes,
            "bytes_sent": bytes_sent,
            "compute_s": self.compute_s,
            "overlap": self.overlap,
            "predicted_comm_s": self.predicted_comm_s,
            "predicted_step_s": self.predicted_step_s,
            "comm_s": comm_s,
            "bw_used_Bps": self.bandwidth_Bps,
            "progress": self.progress,
            "progress_levels": None if self.progress_levels is None else [round(q, 4) for q in self.progress_levels],
            "predicted_levels": None
            if self.predicted_levels is None
            else [_json_safe(round(p, 4)) for p in self.predicted_levels],
            "per_byte_s": self.per_byte_s,
            "bw_Bps": link.bandwidth_Bps,
            "min_rtt_s": link.min_rtt_s,
            "srtt_s": link.srtt_s,
            "queue_s": link.queue_delay_s,
            "standing_queue_s": link.standing_queue_s,
            "loss_rate": link.loss_rate,
            "app_limited": link.app_limited,
            "cwnd_bytes": link.cwnd_bytes,
            "bytes_in_flight": link.bytes_in_flight,
        }
        return {k: _json_safe(v) for k, v in rec.items()}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of sending one level this step (DESIGN.md §5)."""

    comm_s: float
    """T_l = r_l * S * max(1 / B, c) + min_rtt + e_l (c: measured seconds per wire byte, 0 if unknown)."""
    step_s: float
    """P_l = Tc + T_l, or max(Tc, T_l) when communication overlaps compute."""


def predict(
    level: Level,
    *,
    payload_bytes: int,
    bandwidth_Bps: float,
    min_rtt_s: float,
    compute_s: float,
    overlap: bool,
    per_byte_s: float = 0.0,
) -> Prediction:
    """The §5 step-time model for one level; `per_byte_s` is the transport's measured cost of a
    wire byte (`TransportCost`), which bounds the rate where the hosts, not the link, limit it."""
    wire_s = level.wire_bytes(payload_bytes) * max(1.0 / bandwidth_Bps, per_byte_s)
    comm = wire_s + min_rtt_s + level.codec_s(payload_bytes)
    return Prediction(comm, max(compute_s, comm) if overlap else compute_s + comm)


def predict_steps(levels: list[Level], **conditions: Any) -> list[float]:
    """P_l of every level in `levels` under the same `conditions` (the keywords of `predict`)."""
    return [predict(lv, **conditions).step_s for lv in levels]


class Policy(ABC):
    """Picks a codec level per step from the link state; learns from `observe` feedback."""

    def __init__(self, ladder: Ladder, *, name: str) -> None:
        self.ladder = ladder
        """The levels this policy chooses among."""
        self.name = name
        """The spec this policy was made from (goes into every decision)."""
        self._levels: dict[str, Level] = {}

    @abstractmethod
    def choose(
        self, *, link: LinkState, payload_bytes: int, compute_s: float, overlap: bool = False, step: int
    ) -> Decision:
        """Decide the level for `step`; `payload_bytes` is the dense fp32 size S, `compute_s` Tc."""

    def observe(
        self,
        *,
        step: int,
        level: int | None,
        bytes_sent: int,
        comm_s: float,
        time_s: float | None = None,
        rtt_s: float | None = None,
        app_limited: bool | None = None,
    ) -> None:
        """Feedback after a send: `bytes_sent` wire bytes took `comm_s` (first byte to ack, codec
        time excluded). `time_s` defaults to the last link snapshot's time; `rtt_s` is an optional
        application-measured RTT sample; `app_limited` marks a send known not to fill the pipe.
        The default ignores feedback; adaptive policies override."""

    def rechoose(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        """Mid-push: the push of `sent` has run `elapsed_s` (first byte on) and `bytes_acked` of it
        arrived, with bytes still unsent; `link` is the path now. A decision for a heavier level
        means: withdraw the unsent part and send this step at that level instead (error feedback
        keeps that exact); None lets the push finish. Default: None (the level stands)."""
        return None

    def observe_progress(self, *, level: int, progress: float) -> None:
        """A measured progress efficiency q of ladder level `level` (docs/POLICIES.md): from the
        level just sent, or from a candidate measured on a gradient sample. Default: ignored."""

    def progress_candidates(self, step: int) -> list[int]:
        """Ladder levels whose q the caller should measure on this step's gradient (cheaply, off the
        critical path) and report with `observe_progress`. Default: none."""
        return []

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        """A timing of ladder level `level`: `encode_s` / `decode_s` seconds for `dense_bytes` of
        fp32 input (either may be None). Default: ignored (the ladder's figures stand)."""

    def level_of(self, spec: str, payload_bytes: int) -> tuple[int | None, Level]:
        """Ladder index and level for `spec`; an off-ladder spec gets nominal, uncalibrated figures."""
        index = self.ladder.find(spec)
        if index is not None:
            return index, self.ladder[index]
        level = self._levels.get(spec)
        if level is None:
            level = self._levels[spec] = level_for(spec, numel=max(1, payload_bytes // 4))
        return None, level

    def _decision(
        self,
        *,
        level_index: int | None,
        level: Level,
        reason: str,
        link: LinkState,
        bandwidth_Bps: float | None,
        payload_bytes: int,
        compute_s: float,
        overlap: bool,
        step: int,
        progress: float | None = None,
        progress_levels: tuple[float, ...] | None = None,
        per_byte_s: float = 0.0,
        predicted_levels: tuple[float, ...] | None = None,
    ) -> Decision:
        comm = step_s = None
        if bandwidth_Bps is not None and bandwidth_Bps > 0:
            pred = predict(
                level,
                payload_bytes=payload_bytes,
                bandwidth_Bps=bandwidth_Bps,
                min_rtt_s=link.min_rtt_s or 0.0,
                compute_s=compute_s,
                overlap=overlap,
                per_byte_s=per_byte_s,
            )
            comm, step_s = pred.comm_s, pred.step_s
        return Decision(
            level=level_index,
            spec=level.spec,
            predicted_comm_s=comm,
            predicted_step_s=step_s,
            reason=reason,
            step=step,
            payload_bytes=payload_bytes,
            predicted_bytes=round(level.wire_bytes(payload_bytes)),
            compute_s=compute_s,
            overlap=overlap,
            bandwidth_Bps=bandwidth_Bps,
            policy=self.name,
            progress=progress,
            progress_levels=progress_levels,
            predicted_levels=predicted_levels,
            per_byte_s=per_byte_s,
        )


def _check_inputs(payload_bytes: int, compute_s: float) -> None:
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes}")
    if not (math.isfinite(compute_s) and compute_s >= 0):
        raise ValueError(f"compute_s must be finite and >= 0, got {compute_s}")


class PolicyFactory(Protocol):
    """Builds a policy from the text after ``name:`` (or None), the ladder and keyword settings."""

    def __call__(self, arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy: ...


_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Register `factory` under `name` so that ``make_policy(name[:arg], ...)`` finds it."""
    if not name or ":" in name:
        raise ValueError(f"policy name {name!r} must be non-empty without ':'")
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    """Names of every registered policy."""
    return sorted(_REGISTRY)


def make_policy(spec: str, ladder: Ladder, **settings: Any) -> Policy:
    """Build the policy `spec` names (``"netsense"``, ``"fixed:qsgd:4"``) over `ladder`.

    Raises `ConfigError` for an unknown name, a missing or unexpected argument, or a bad setting.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"policy spec must be a non-empty string, got {spec!r}")
    name, sep, arg = spec.partition(":")
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r} in {spec!r}; known: {', '.join(policy_names())}")
    return factory(arg if sep else None, ladder, **settings)


_S = TypeVar("_S")


def build_settings(cls: type[_S], policy: str, settings: dict[str, Any]) -> _S:
    """`cls(**settings)`, with unknown or ill-typed keys reported as `ConfigError`."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(
            f"policy {policy!r} has no setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    try:
        return cls(**settings)
    except TypeError as exc:
        raise ConfigError(f"policy {policy!r}: bad settings {settings!r}: {exc}") from exc


def _settings_factory(name: str, policy: Callable[[Ladder, Any], Policy], settings_cls: type) -> PolicyFactory:
    """Factory for a policy that takes no argument and one settings dataclass of keywords."""

    def factory(arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy:
        if arg is not None:
            raise ConfigError(f"policy {name!r} takes no argument, got {arg!r}")
        return policy(ladder, build_settings(settings_cls, name, settings))

    return factory


def _require(ok: bool, policy: str, field: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"policy {policy!r}: setting {field}={value!r} must be {rule}")


# --- fixed levels: none, fp16, fixed:<spec> ---------------------------------------------------


class FixedPolicy(Policy):
    """Always the same codec: the baselines `none`, `fp16` and ``fixed:<spec>``."""

    def __init__(self, ladder: Ladder, spec: str, *, name: str) -> None:
        super().__init__(ladder, name=name)
        self.index, self.level = self.level_of(spec, 1 << 20)  # validates the spec now, not mid-run

    def choose(
        self, *, link: LinkState, payload_bytes: int, compute_s: float, overlap: bool = False, step: int
    ) -> Decision:
        _check_inputs(payload_bytes, compute_s)
        return self._decision(
            level_index=self.index,
            level=self.level,
            reason="fixed",
            link=link,
            bandwidth_Bps=link.bandwidth_Bps,
            payload_bytes=payload_bytes,
            compute_s=compute_s,
            overlap=overlap,
            step=step,
        )


def _fixed_factory(preset: str | None, name: str) -> PolicyFactory:
    def factory(arg: str | None, ladder: Ladder, /, **settings: Any) -> Policy:
        if settings:
            raise ConfigError(f"policy {name!r} takes no settings, got {', '.join(sorted(settings))}")
        if preset is not None:
            if arg is not None:
                raise ConfigError(f"policy {name!r} takes no argument, got {arg!r}")
            return FixedPolicy(ladder, preset, name=name)
        if not arg:
            raise ConfigError("policy 'fixed' needs a codec spec, e.g. 'fixed:topk:0.01+fp16'")
        return FixedPolicy(ladder, arg, name=f"fixed:{arg}")

    return factory


register_policy("none", _fixed_factory("fp32", "none"))
register_policy("fp16", _fixed_factory("fp16", "fp16"))
register_policy("fixed", _fixed_factory(None, "fixed"))


# --- dc2: compression scaled with measured queueing delay ------------------------------------


@dataclass(frozen=True)
class Dc2Settings:
    """Settings of the delay-aware baseline."""

    target_delay_s: float = 0.005
    """Queueing delay (srtt - min_rtt) tolerated before compressing at all."""
    alpha: float = 0.5
    """EWMA weight of the newest delay sample (1.0: no smoothing)."""


class Dc2Policy(Policy):
    """Delay-aware baseline after the idea of DC2 (Abdelmoniem & Canini, INFOCOM'21): the wire
    size allowed shrinks in proportion to how far the smoothed queueing delay d exceeds a target,
    ratio budget = min(1, target / d); send the least lossy level within it. Our reading of the
    idea (a standing queue drains when the offered load falls by target/d), not the paper's code."""

    def __init__(self, ladder: Ladder, settings: Dc2Settings) -> None:
        super().__init__(ladder, name="dc2")
        _require(settings.target_delay_s > 0, "dc2", "target_delay_s", settings.target_delay_s, "> 0")
        _require(0 < settings.alpha <= 1, "dc2", "alpha", settings.alpha, "in (0, 1]")
        self.settings = settings
        self.delay_s: float | None = None
        """Smoothed queueing delay, None before the first RTT sample."""

    def choose(
        self, *, link: LinkState, payload_bytes: int, compute_s: float, overlap: bool = False, step: int
    ) -> Decision:
        _check_inputs(payload_bytes, compute_s)
        if link.srtt_s is not None and link.min_rtt_s is not None:
            q, a = link.queue_delay_s, self.settings.alpha
            self.delay_s = q if self.delay_s is None else a * q + (1 - a) * self.delay_s
        budget = 1.0 if self.delay_s is None else min(1.0, self.settings.target_delay_s / max(self.delay_s, 1e-12))
        # 1% slack: a measured ratio carries a few bytes of framing (fp16 measures 0.5000x, not 0.5).
        index = next((i for i, lv in enumerate(self.ladder) if lv.ratio <= 1.01 * budget), len(self.ladder) - 1)
        return self._decision(
            level_index=index,
            level=self.ladder[index],
            reason=f"dc2: delay={self.delay_s if self.delay_s is not None else float('nan'):.4f}s budget={budget:.4g}",
            link=link,
            bandwidth_Bps=link.bandwidth_Bps,
            payload_bytes=payload_bytes,
            compute_s=compute_s,
            overlap=overlap,
            step=step,
        )


register_policy("dc2", _settings_factory("dc2", Dc2Policy, Dc2Settings))


# --- netsenseml-paper: the seed paper's prototype law -----------------------------------------


@dataclass(frozen=True)
class PaperPolicySettings:
    """Settings of the seed paper's law; defaults are the published ones where it gives them."""

    window_s: float = 5.0
    """Window over which min RTT and max bandwidth are kept."""
    start: float = 0.75
    """Initial top-k density r."""
    r_min: float = 0.001
    """Lowest density the law may reach."""
    r_max: float = 1.0
    """Highest density the law may reach."""
    shrink: float = 0.95
    """Multiplicative decrease of r when the bytes just sent exceed `threshold` * BDP."""
    grow: float = 0.001
    """Additive increase of r otherwise."""
    threshold: float = 0.9
    """Fraction of the BDP above which a send counts as filling the pipe."""
    codec: str = "topk"
    """Sparsifier the density is handed to: the emitted spec is ``"<codec>:<r>"``."""
    digits: int = 3
    """Significant digits of r in the emitted spec (bounds the number of distinct codecs)."""


class PaperPolicy(Policy):
    """NetSenseML's prototype law (DESIGN.md §5), reproduced as published: BDP = max bw * min
    RTT over a 5 s window, both measured at the application; after each send, if its bytes
    exceed 0.9 * BDP then r = max(r_min, 0.95 r) else r = min(r_max, r + 0.001); start at 0.75."""

    def __init__(self, ladder: Ladder, settings: PaperPolicySettings) -> None:
        super().__init__(ladder, name="netsenseml-paper")
        s = settings
        _require(s.window_s > 0, self.name, "window_s", s.window_s, "> 0")
        _require(0 < s.r_min <= s.r_max <= 1, self.name, "r_min/r_max", (s.r_min, s.r_max), "0 < r_min <= r_max <= 1")
        _require(s.r_min <= s.start <= s.r_max, self.name, "start", s.start, "within [r_min, r_max]")
        _require(0 < s.shrink < 1, self.name, "shrink", s.shrink, "in (0, 1)")
        _require(s.grow >= 0, self.name, "grow", s.grow, ">= 0")
        _require(s.threshold > 0, self.name, "threshold", s.threshold, "> 0")
        _require(1 <= s.digits <= 8, self.name, "digits", s.digits, "in [1, 8]")
        self.settings = s
        self.density = s.start
        """Current top-k density r (unrounded)."""
        self._bw: deque[tuple[float, float]] = deque()  # (time, bytes/s) at the application
        self._rtt: deque[tuple[float, float]] = deque()  # (time, seconds)
        self._now = 0.0
        self.level_of(self.spec, 1 << 20)  # fail at config time if the sparsifier is not registered

    @property
    def spec(self) -> str:
        """The codec spec for the current density."""
        return f"{self.settings.codec}:{self.density:.{self.settings.digits}g}"

    @property
    def bdp_bytes(self) -> float | None:
        """max bandwidth * min RTT over the window, None until both have a sample."""
        if not self._bw or not self._rtt:
            return None
        return max(b for _, b in self._bw) * min(r for _, r in self._rtt)

    def choose(
        self, *, link: LinkState, payload_bytes: int, compute_s: float, overlap: bool = False, step: int
    ) -> Decision:
        _check_inputs(payload_bytes, compute_s)
        self._now = link.time_s
        rtt = link.srtt_s if link.srtt_s is not None else link.min_rtt_s
        if rtt is not None:
            self._add(self._rtt, link.time_s, rtt)
        index, level = self.level_of(self.spec, payload_bytes)
        bw = max((b for _, b in self._bw), default=None)
        return self._decision(
            level_index=index,
            level=level,
            reason=f"paper: r={self.density:.6g} bdp={self.bdp_bytes}",
            link=link,
            bandwidth_Bps=bw,
            payload_bytes=payload_bytes,
            compute_s=compute_s,
            overlap=overlap,
            step=step,
        )

    def observe(
        self,
        *,
        step: int,
        level: int | None,
        bytes_sent: int,
        comm_s: float,
        time_s: float | None = None,
        rtt_s: float | None = None,
        app_limited: bool | None = None,
    ) -> None:
        """Adds the send's rate (bytes / comm time) and any RTT sample, then applies the law."""
        t = self._now if time_s is None else time_s
        self._now = t
        if bytes_sent > 0 and comm_s > 0:
            self._add(self._bw, t, bytes_sent / comm_s)
        if rtt_s is not None and rtt_s > 0:
            self._add(self._rtt, t, rtt_s)
        bdp = self.bdp_bytes
        if bdp is None:
            return
        s = self.settings
        if bytes_sent > s.threshold * bdp:
            self.density = max(s.r_min, s.shrink * self.density)
        else:
            self.density = min(s.r_max, self.density + s.grow)

    def _add(self, window: deque[tuple[float, float]], t: float, value: float) -> None:
        window.append((t, value))
        cutoff = t - self.settings.window_s
        for w in (self._bw, self._rtt):
            while w and w[0][0] < cutoff:
                w.popleft()


register_policy("netsenseml-paper", _settings_factory("netsenseml-paper", PaperPolicy, PaperPolicySettings))


# --- netsense: compress only as much as buys time ---------------------------------------------


@dataclass(frozen=True)
class NetsensePolicySettings:
    """Settings of our policy; one place for its defaults (docs/POLICIES.md explains each)."""

    eps: float = 0.1
    """The least lossy level whose predicted cost (P_l / q_l) is within (1 + eps) of the best one wins."""
    relax_eps: float = 0.05
    """Stricter tolerance a lighter level must meet to count as headroom (a dead band against flapping)."""
    k: int = 5
    """Consecutive steps of headroom before moving back toward lighter levels."""
    relax_rise: float = 1.5
    """Once the bandwidth is this many times the lowest seen at the committed level, the link
    changed (not +-10% jitter): headroom is judged with `eps`, not the stricter `relax_eps` (0: never)."""
    max_k: int = 80
    """Cap of k's back-off: a relax undone within k steps doubles k; one that holds halves it again."""
    probe_interval: int = 20
    """While app-limited at a lossy level, send one step a level lighter this often (0: never)."""
    probe_interval_s: float = 2.0
    """...or after this many seconds without a change or probe, whichever comes first (0: only by
    steps). Seconds bound the recovery time however long a step takes."""
    queue_tolerance_s: float = 0.010
    """Standing queue (srtt - min_rtt) ignored before it starts to shrink the bandwidth."""
    safe_level: int = 0
    """Level used while the bandwidth is unknown (0: lossless)."""
    warmup_steps: int = 0
    """Steps, from the first decision, during which the level is capped at `warmup_level`."""
    warmup_level: int = 0
    """Heaviest level allowed during warm-up."""
    app_window: int = 4
    """Application bandwidth samples are max-filtered over this many most recent observations."""
    min_sample_bytes: int = 256 * 1024
    """A send smaller than this measures latency, not bandwidth: its sample is app-limited..."""
    min_sample_rtts: float = 8.0
    """...unless it lasted at least this many min RTTs (and carried >= min_sample_bytes / 16): then
    the ramp-up is a small part of it, as for a 150 kB push taking 30 ms over a 2 ms loopback RTT
    (0: size alone decides)."""
    progress_aware: bool = True
    """Weigh each level's step time by its progress efficiency q (cost P_l / q_l); False: the
    step-time law of DESIGN.md §5 as first written (P_l alone), kept for comparison."""
    tie_eps: float = 0.01
    """Among levels of equal progress (q within `progress_tol`, e.g. fp32 and fp16), a cheaper one
    wins when its predicted step is shorter by more than this fraction."""
    progress_tol: float = 0.005
    """Levels whose q differ by at most this count as equally progressive."""
    progress_alpha: float = 0.3
    """EWMA weight of the newest q measurement of a level."""
    progress_floor: float = 0.01
    """Lowest q used in P_l / q_l."""
    progress_every: int = 50
    """Ask for a measurement of every lossy level's q on a gradient sample this often (steps; 0: never).
    One round costs ~4-5 ms per lossy level on digits-cnn (6 keys, 2 shared cores): every 10 steps
    that was ~12% of a 20 ms loopback step; q drifts over hundreds of steps."""
    progress_budget: float = 0.01
    """Largest share of the time candidate rounds may take: a round due by `progress_every` waits
    (to the next multiple) until the time since the last one is at least its predicted cost (every
    lossy level's measured codec time on the sample) over this share (0: no limit). Unshaped, a
    round took 15-30 ms on a 15-18 ms step: every 50 steps that was ~5 % of the run."""
    measured_costs: bool = True
    """Predict with each level's measured encode/decode seconds per MB (`observe_costs`: the
    sender's timings and the candidate rounds) instead of the ladder's figures once timed."""
    cost_window: int = 8
    """Timings per level whose median is its measured cost."""
    transport_cost: bool = True
    """Charge wire bytes at least the transport's measured marginal cost per byte (`TransportCost`,
    fitted over the sends of different levels), not only 1 / B: on CPU-bound paths (loopback QUIC)
    bytes cost host time that a delivery-rate bandwidth does not show."""


SLOWED_MIN_RTTS = 2.0
"""A send counts as slowed only if it lasted at least this many min RTTs beyond the first..."""
SLOWED_MIN_S = 0.02
"""...and at least this long: a small send pays a fixed per-message cost (the hosts' scheduling,
the PS's handling, delayed acks) of a few ms that a sub-ms loopback RTT does not cover; a 20 kB
loopback push took 5-12 ms whatever the level, which read as 16-32 Mbit/s and spiralled the
uplink into top-k 10 % on 217 of 300 steps..."""
SLOWED_FRACTION = 0.5
"""...and ran at under this fraction of the current estimate (`BandwidthEstimate.add_app_sample`)."""


class BandwidthEstimate:
    """Combines the transport's bandwidth with application samples, BBR's way.

    The most recent *trusted* evidence sets the estimate: the link's value when the link is not
    app-limited (it is already a windowed max), else the max over the last `app_window`
    application samples when a new non-app-limited one has arrived. App-limited evidence (the
    link's value while app-limited, short sends) can raise the estimate, never lower it, and
    never creates one: with nothing trusted the bandwidth stays unknown.
    """

    def __init__(self, *, app_window: int, min_sample_bytes: int, min_sample_rtts: float = 0.0) -> None:
        self.value_Bps: float | None = None
        """The current estimate (before queue and loss shrinkage), None while unknown."""
        self.min_sample_bytes = min_sample_bytes
        self.min_sample_rtts = min_sample_rtts
        self._app: deque[tuple[float, bool]] = deque(maxlen=app_window)  # (bytes/s, app-limited)
        self._fresh_app = False
        self._fresh_bounds: list[float] = []  # app-limited rates since the last update: lower bounds
        self._fresh_slowed = False  # a slowed send (see `add_app_sample`) since the last update
        self._slow_before = False  # the previous send was slow (a slowed send needs two in a row)
        self._discounted: float | None = None  # an app-limited link value a slowed send showed stale
        self.lower_bound_Bps: float | None = None
        """Max of the recent app-limited evidence (the last `app_window` application samples and the
        link's app-limited value at the last update): the path carries at least this much."""

    @property
    def link_stale(self) -> bool:
        """True while the link's app-limited value is one a slowed send showed stale (until the
        link has a trusted value again): its app-limited flag then says nothing about now."""
        return self._discounted is not None

    @property
    def last_sample_app_limited(self) -> bool:
        """True when the latest application sample did not fill the pipe."""
        return bool(self._app) and self._app[-1][1]

    def add_app_sample(self, *, bytes_sent: int, comm_s: float, min_rtt_s: float, app_limited: bool) -> None:
        """Record one send; a latency-bound or small, short send is marked app-limited, unless it
        was *slowed*: it and the send before it each spanned at least 2 min RTTs beyond the first
        and ran at under half the estimate. An application limit can make a send short, never slow, so a slowed send is
        evidence that the path lost capacity, however small: 76 kB pushes after a 100 -> 10 Mbit/s
        step took 4-5x their predicted time, and as "small" sends they could not lower the estimate
        (the dynamic-trace benchmark held 44-54 Mbit/s through the 10 Mbit/s phase). A slowed
        sample replaces the higher application samples before it."""
        if bytes_sent <= 0 or comm_s <= 0:
            return
        net_s = comm_s - min_rtt_s  # the ack's return trip carries no payload
        latency_bound = net_s <= 0.5 * comm_s
        rate = bytes_sent / (comm_s if latency_bound else net_s)
        long_enough = (
            self.min_sample_rtts > 0
            and min_rtt_s > 0
            and net_s >= self.min_sample_rtts * min_rtt_s
            and bytes_sent >= self.min_sample_bytes / 16
        )
        slow = (
            not app_limited
            and self.value_Bps is not None
            and min_rtt_s > 0
            and net_s >= max(SLOWED_MIN_RTTS * min_rtt_s, SLOWED_MIN_S)
            and bytes_sent >= self.min_sample_bytes / 16
            and rate < SLOWED_FRACTION * self.value_Bps
        )
        # Two in a row: a path that lost capacity slows every send; a stalled host (CPU contention
        # on shared cores slows a 40 kB loopback push to 8 ms now and then) mostly one.
        slowed, self._slow_before = slow and self._slow_before, slow
        small = bytes_sent < self.min_sample_bytes and not long_enough and not slowed
        limited = app_limited or latency_bound or small
        if slowed:
            self._app = deque(((r, lim) for r, lim in self._app if lim or r <= rate), maxlen=self._app.maxlen)
            self._fresh_slowed = True
        self._app.append((rate, limited))
        if limited:
            self._fresh_bounds.append(rate)
        else:
            self._fresh_app = True

    def update(self, link: LinkState) -> float | None:
        """Fold in the link snapshot and any new application samples; return the estimate."""
        link_bw = link.bandwidth_Bps if link.bandwidth_Bps and link.bandwidth_Bps > 0 else None
        if link_bw is not None and not link.app_limited:
            self.value_Bps = link_bw
            self._discounted = None
        elif self._fresh_app:
            self.value_Bps = max(r for r, limited in self._app if not limited)
        if self._fresh_slowed and link_bw is not None and link.app_limited:
            # The link's app-limited value is a max kept until a trusted sample replaces it: after a
            # slowed send it is stale, and would restore the old estimate at every update.
            self._discounted = max(self._discounted or 0.0, link_bw)
        if link_bw is not None and link.app_limited and self._discounted is not None and link_bw <= self._discounted:
            link_bw = None  # no news: only an app-limited value above the stale one is a new bound
        if self.value_Bps is not None:
            bounds = self._fresh_bounds + ([link_bw] if link_bw is not None else [])
            self.value_Bps = max([self.value_Bps, *bounds])
        self._fresh_app = self._fresh_slowed = False
        self._fresh_bounds = []
        limited = [r for r, lim in self._app if lim] + ([link_bw] if link_bw is not None and link.app_limited else [])
        self.lower_bound_Bps = max(limited, default=None)
        return self.value_Bps


class NetsensePolicy(Policy):
    """Ours (DESIGN.md §5): T_l = r_l S / B + min_rtt + e_l with the queue-free bandwidth B;
    P_l = Tc + T_l (or max(Tc, T_l) with overlap); the least lossy level with P_l <= (1+eps) P*
    wins; heavier at once, lighter after k steps of headroom; upward probes while app-limited."""

    def __init__(self, ladder: Ladder, settings: NetsensePolicySettings) -> None:
        super().__init__(ladder, name="netsense")
        s, n, top = settings, "netsense", len(ladder) - 1
        _require(s.eps >= 0, n, "eps", s.eps, ">= 0")
        _require(0 <= s.relax_eps <= s.eps, n, "relax_eps", s.relax_eps, "in [0, eps]")
        _require(s.k >= 1, n, "k", s.k, ">= 1")
        _require(s.max_k >= s.k, n, "max_k", s.max_k, ">= k")
        _require(s.relax_rise == 0 or s.relax_rise > 1, n, "relax_rise", s.relax_rise, "0 or > 1")
        _require(s.probe_interval >= 0, n, "probe_interval", s.probe_interval, ">= 0")
        _require(s.probe_interval_s >= 0, n, "probe_interval_s", s.probe_interval_s, ">= 0")
        _require(s.min_sample_rtts >= 0, n, "min_sample_rtts", s.min_sample_rtts, ">= 0")
        _require(s.queue_tolerance_s >= 0, n, "queue_tolerance_s", s.queue_tolerance_s, ">= 0")
        _require(0 <= s.safe_level <= top, n, "safe_level", s.safe_level, f"a level index in [0, {top}]")
        _require(0 <= s.warmup_level <= top, n, "warmup_level", s.warmup_level, f"a level index in [0, {top}]")
        _require(s.warmup_steps >= 0, n, "warmup_steps", s.warmup_steps, ">= 0")
        _require(s.app_window >= 1, n, "app_window", s.app_window, ">= 1")
        _require(s.min_sample_bytes >= 0, n, "min_sample_bytes", s.min_sample_bytes, ">= 0")
        _require(s.tie_eps >= 0, n, "tie_eps", s.tie_eps, ">= 0")
        _require(0 <= s.progress_tol < 1, n, "progress_tol", s.progress_tol, "in [0, 1)")
        _require(0 < s.progress_alpha <= 1, n, "progress_alpha", s.progress_alpha, "in (0, 1]")
        _require(0 < s.progress_floor <= 1, n, "progress_floor", s.progress_floor, "in (0, 1]")
        _require(s.progress_every >= 0, n, "progress_every", s.progress_every, ">= 0")
        _require(0 <= s.progress_budget < 1, n, "progress_budget", s.progress_budget, "in [0, 1)")
        _require(s.cost_window >= 1, n, "cost_window", s.cost_window, ">= 1")
        self.settings = s
        self.costs = CodecCosts(ladder, window=s.cost_window)
        """Measured encode/decode cost per level (the ladder's figures until timed)."""
        self.transport = TransportCost()
        """Measured marginal seconds per wire byte, fitted across levels."""
        self._payload_bytes = 0  # S of the last decision
        self._queue_s = 0.0  # the link's standing queue at the last decision
        self._now_s = 0.0  # link time of the last decision
        self._exploring: int | None = None  # the level the last decision explored
        self.progress = ProgressEstimate(ladder, alpha=s.progress_alpha, floor=s.progress_floor)
        """Progress efficiency q per level: codec priors, refined by `observe_progress`."""
        self.bandwidth = BandwidthEstimate(
            app_window=s.app_window, min_sample_bytes=s.min_sample_bytes, min_sample_rtts=s.min_sample_rtts
        )
        """Bandwidth estimator fed by `choose` (link) and `observe` (application samples)."""
        self.level: int | None = None
        """Committed level (probes excepted), None before the first decision."""
        self.k_now = s.k
        """Current headroom requirement (k with back-off)."""
        self._decisions = 0
        self._headroom = 0
        self._relax_to = 0
        self._since_change = 0
        self._since_probe = 0
        self._moved_at: float | None = None  # link time of the last change or probe
        self._predicted_wire_s: float | None = None  # of the last decision with a known bandwidth
        self._last_send_slow = False  # the last send took much longer than predicted
        self._since_relax: int | None = None  # steps since the last relax, while it is on probation
        self._low_bw: float | None = None  # the lowest bandwidth seen at the committed level
        self._min_rtt_s = 0.0
        self._round: tuple[int, float] | None = None  # step and link time of the latest candidate round

    def effective_bandwidth(self, link: LinkState) -> float | None:
        """The estimate shrunk by losses and, on a saturated path, by a queue beyond the tolerance.

        B_eff = B * (1 - min(loss, 0.5)) * min(1, (min_rtt + tolerance) / (min_rtt + queue)), the
        queue being the link's standing queue (`LinkState.standing_queue_s`: the least RTT over the
        recent window less the least ever), else srtt - min_rtt. srtt carries the queue our own
        push built and that drains before the next one: 1 MB pushes at 50 Mbit/s through a 50 ms
        drop-tail queue left srtt at 40-60 ms over a 21 ms path, which halved B with nobody else on
        the link (docs/BENCHMARKS.md, rate step). The queue term applies only while the latest
        samples (link and application) were not app-limited: a full pipe plus a standing queue means
        the bottleneck is shared or overrun. RTT inflation while we send too little to fill anything
        is as often the hosts' CPUs (30-50 ms srtt over a 2 ms min RTT was seen with a PS and two
        workers in one process on 2 cores) as someone else's queue.
        """
        bw = self.bandwidth.update(link)
        if bw is None:
            return None
        bw *= 1.0 - min(max(link.loss_rate, 0.0), 0.5)
        saturated = not (link.app_limited or self.bandwidth.last_sample_app_limited)
        queue = link.standing_queue_s if link.standing_queue_s is not None else link.queue_delay_s
        if saturated and link.min_rtt_s is not None and link.min_rtt_s + queue > 0:
            rtt = link.min_rtt_s
            bw *= min(1.0, (rtt + self.settings.queue_tolerance_s) / (rtt + queue))
        return bw

    def choose(
        self, *, link: LinkState, payload_bytes: int, compute_s: float, overlap: bool = False, step: int
    ) -> Decision:
        _check_inputs(payload_bytes, compute_s)
        s = self.settings
        self._decisions += 1
        if link.min_rtt_s is not None:
            self._min_rtt_s = link.min_rtt_s
        self._payload_bytes, self._queue_s, self._now_s = payload_bytes, link.queue_delay_s, link.time_s
        bw = self.effective_bandwidth(link)
        levels = self._levels_now()
        per_byte = self._per_byte_s()
        preds: list[float] | None = None  # set once the law has predicted every level

        def emit(index: int, reason: str) -> Decision:
            return self._decision(
                level_index=index,
                level=levels[index],
                reason=reason,
                link=link,
                bandwidth_Bps=bw,
                payload_bytes=payload_bytes,
                compute_s=compute_s,
                overlap=overlap,
                step=step,
                progress=self._q(index),
                progress_levels=tuple(self.progress.values),
                per_byte_s=per_byte,
                predicted_levels=None if preds is None else tuple(preds),
            )

        bound = self.bandwidth.lower_bound_Bps if bw is None and s.progress_aware else None
        if bw is None and bound is None:
            if self.level is None:
                self.level = s.safe_level
            return emit(self.level, "unknown-bandwidth")
        if bw is None:
            bw = bound  # `emit` reports it as the bandwidth used
        assert bw is not None
        rtt = link.min_rtt_s or 0.0
        preds = predict_steps(levels, payload_bytes=payload_bytes, bandwidth_Bps=bw, min_rtt_s=rtt,
                              compute_s=compute_s, overlap=overlap, per_byte_s=per_byte)  # fmt: skip
        if bound is not None:
            # Only a lower bound is known (every send so far was app-limited: small, latency-bound):
            # it overstates comm time, so it may choose only among levels that lose no measurable
            # progress (fp32, fp16, and 8-bit once measured): the worst it costs is a cast.
            preds = [p if self._q(i) >= 1 - s.progress_tol else math.inf for i, p in enumerate(preds)]
        reason = self._step_law(preds, bw) + (" (lower bound B)" if bound is not None else "")
        index = self.level
        assert index is not None
        if self._decisions <= s.warmup_steps and index > s.warmup_level:
            return emit(s.warmup_level, f"warm-up: law wanted {self.ladder[index].spec}")
        if self._moved_at is None or self._since_change == 0:
            self._moved_at = link.time_s
        if self._probe_due(link, reason) and self._capacity_matters(
            levels, bw, payload_bytes=payload_bytes, compute_s=compute_s, overlap=overlap, rtt=rtt, per_byte=per_byte
        ):
            self._since_probe = 0
            self._moved_at = link.time_s
            probe = self._probe_level(index, payload_bytes)
            return self._sent(emit(probe, f"probe: {index - probe} lighter than {self.ladder[index].spec}"), bw, rtt)
        explore = self._explore_level(link, reason)
        self._exploring = explore
        if explore is not None:
            self._since_probe = 0
            self._moved_at = link.time_s
            return self._sent(emit(explore, f"explore: per-byte cost unknown, {self.ladder[explore].spec}"), bw, rtt)
        return self._sent(emit(index, reason), bw, rtt)

    def _explore_level(self, link: LinkState, reason: str) -> int | None:
        """A heavier level to send once, on the probes' cadence, while the transport's per-byte cost
        is unknown: the fit needs sends of two sizes, and a path where fp32 ties fp16 on bandwidth
        alone may never send fp16 otherwise. Only from a lossless level (from a lossy one the probes
        send lighter levels) and only to a level that loses no measurable progress and is
        `MIN_SIZE_SPREAD` smaller (fp16 from fp32): the worst it costs is a few casts."""
        s, index = self.settings, self.level
        if not (s.transport_cost and s.progress_aware) or index is None or not reason.startswith("hold: C*"):
            return None
        if not self.ladder[index].lossless:
            return None  # a lossy level gets its second point from the probes (lighter levels)
        if self.transport.s_per_byte(link.time_s) is not None:
            return None
        going = self._exploring
        if going is not None and self.transport.count(going) < self.transport.min_samples:
            return going  # a point needs `min_samples` sends: explore for that many steps in a row
        steps = min(self._since_change, self._since_probe)
        due = (s.probe_interval > 0 and steps >= s.probe_interval) or (
            s.probe_interval_s > 0
            and steps >= 2
            and self._moved_at is not None
            and link.time_s - self._moved_at >= s.probe_interval_s
        )
        if not due:
            return None
        size = self.ladder[index].ratio
        return next(
            (
                j
                for j in range(index + 1, len(self.ladder))
                if self._q(j) >= 1 - s.progress_tol and self.ladder[j].ratio * self.transport.min_spread <= size
            ),
            None,
        )

    def _probe_level(self, index: int, payload_bytes: int) -> int:
        """The heaviest lighter level whose send is big enough to be a bandwidth sample (a probe too
        small to measure anything reveals nothing); one level lighter when none is."""
        big = [i for i in range(index) if self.ladder[i].wire_bytes(payload_bytes) >= self.settings.min_sample_bytes]
        return max(big) if big else index - 1

    def _levels_now(self) -> list[Level]:
        """The ladder with measured codec costs where timed (the ladder's figures otherwise)."""
        return self.costs.levels() if self.settings.measured_costs else list(self.ladder)

    def _per_byte_s(self) -> float:
        """The transport's measured marginal seconds per wire byte (0 while unknown or off)."""
        return (self.transport.s_per_byte(self._now_s) or 0.0) if self.settings.transport_cost else 0.0

    def _sent(self, decision: Decision, bw: float, rtt: float) -> Decision:
        """Remember the wire time predicted for this decision (codec time excluded, as `comm_s`)."""
        self._predicted_wire_s = decision.predicted_bytes / bw + rtt
        return decision

    def _q(self, index: int) -> float:
        """q of level `index` as the law uses it (1 everywhere when not progress-aware)."""
        return self.progress[index] if self.settings.progress_aware else 1.0

    def _law(self, preds: list[float], eps: float, tie_eps: float) -> tuple[int, list[int]]:
        """The levels the law accepts (ascending) and its pick, the first of them.

        Cost C_l = P_l / q_l (time per unit of progress); A = levels with C_l <= (1 + eps) C*;
        among A keep the most progressive (q within `progress_tol` of A's best q) and of those the
        ones whose P_l is within (1 + tie_eps) of their fastest. Without progress awareness every q
        is 1, so the tie rule would pick the fastest level outright: it then keeps §5's original
        rule (least lossy within eps of the best P)."""
        s = self.settings
        q = [self._q(i) for i in range(len(preds))]
        cost = [p / qi for p, qi in zip(preds, q)]
        best = min(cost)
        ok = [i for i, c in enumerate(cost) if c <= (1 + eps) * best]
        if not s.progress_aware:
            return ok[0], ok
        q_best = max(q[i] for i in ok)
        equal = [i for i in ok if q[i] >= q_best - s.progress_tol]
        fastest = min(preds[i] for i in equal)
        pick = [i for i in equal if preds[i] <= (1 + tie_eps) * fastest]
        return pick[0], pick

    def _step_law(self, preds: list[float], bw: float) -> str:
        """Apply the law with hysteresis to the committed level (`bw`: the bandwidth the predictions
        used); return the reason."""
        s = self.settings
        best = min(p / self._q(i) for i, p in enumerate(preds))
        target, ok = self._law(preds, s.eps, s.tie_eps)
        if self.level is None:
            self._set_level(target)
            return f"law: C*={best:.4g}s"
        current = self.level
        self._since_change += 1
        self._since_probe += 1
        self._low_bw = bw if self._low_bw is None else min(self._low_bw, bw)
        if self._since_relax is not None:
            self._since_relax += 1
            if self._since_relax >= self.k_now:  # the relax held: trust relaxing a bit sooner again
                self.k_now = max(s.k, self.k_now // 2)
                self._since_relax = None
        fits = current in ok
        if not fits and target > current:
            self._go_heavier(target, bw)
            return f"heavier: C_{current}={preds[current] / self._q(current):.4g}s, C*={best:.4g}s"
        # Headroom is judged by the same law with the stricter tolerances (a dead band), unless the
        # bandwidth rose well above the lowest seen at this level: then the link changed, and the
        # dead band would only hold a level the law no longer picks (the rate-step test's 100 ->
        # 20 -> 100 Mbit/s: relaxing qsgd:4 -> qsgd:8 needed 51 Mbit/s per worker with relax_eps,
        # 30 with eps, and each worker's share was 50).
        strict = s.relax_eps / s.eps if s.eps > 0 else 0.0
        lighter = self._law(preds, s.relax_eps, s.tie_eps * strict)[0] if fits else target
        rose = s.relax_rise > 0 and self._low_bw is not None and bw >= s.relax_rise * self._low_bw
        if rose and target < lighter:
            lighter = target
        if lighter >= current:
            # After a rise one dip of the estimate (a push slowed by the hosts' CPUs: 23-29 Mbit/s
            # among 45-55 was seen) pauses the count of headroom steps instead of restarting it.
            if not rose:
                self._headroom = 0
            return f"hold: C*={best:.4g}s"
        self._relax_to = max(self._relax_to, lighter) if self._headroom else lighter
        self._headroom += 1
        if self._headroom < self.k_now:
            return f"hold: headroom {self._headroom}/{self.k_now} toward {self.ladder[lighter].spec}"
        self._set_level(self._relax_to)
        self._since_relax = 0
        return f"relax: {self.k_now} steps of headroom, C*={best:.4g}s"

    def _go_heavier(self, target: int, bw: float) -> None:
        """Commit to the heavier `target` (the law's pick at bandwidth `bw`)."""
        if self._since_relax is not None:  # undone within k steps: it was noise, wait longer next time
            self.k_now = min(self.settings.max_k, self.k_now * 2)
            self._since_relax = None
        self._set_level(target)
        self._low_bw = bw

    def _set_level(self, index: int) -> None:
        if index != self.level:
            logger.debug("netsense level %s -> %s", self.level, index, extra={"level": index})
            self._since_change = 0
            self._low_bw = None
        self.level = index
        self._headroom = 0

    def _probe_due(self, link: LinkState, reason: str) -> bool:
        s = self.settings
        app_limited = (link.app_limited and not self.bandwidth.link_stale) or self.bandwidth.last_sample_app_limited
        steps = min(self._since_change, self._since_probe)
        by_steps = s.probe_interval > 0 and steps >= s.probe_interval
        by_time = (
            s.probe_interval_s > 0
            and steps >= 2  # at least one step at the committed level between probes
            and self._moved_at is not None
            and link.time_s - self._moved_at >= s.probe_interval_s
        )
        return (
            (by_steps or by_time)
            and app_limited
            and self.level is not None
            and self.level > 0
            and reason.startswith("hold: C*")  # neither just moved nor already on the way lighter
            and not self._last_send_slow  # a send slower than predicted says less capacity, not more
        )

    def _capacity_matters(
        self,
        levels: list[Level],
        bw: float,
        *,
        payload_bytes: int,
        compute_s: float,
        overlap: bool,
        rtt: float,
        per_byte: float,
    ) -> bool:
        """Whether more bandwidth than `bw` could make the law pick a level lighter than the committed
        one, which is what a probe looks for. It could unless the measured per-byte cost c alone
        rules the lighter levels out: at unlimited bandwidth a byte still costs the part of c that
        1 / `bw` does not explain (the hosts' CPUs: on unshaped loopback c was up to 2x 1 / B, and
        fp16 beat fp32 by 0.5-1.5 ms a step). There the probes (an fp32 step every 20 on each worker
        and the PS, ~15 % of steps with one) can reveal nothing that moves the choice. On a
        link-bound path c is ~1 / B, nothing is left over, and the probes go on as before."""
        host = per_byte - 1.0 / bw
        if host <= 0:
            return True
        unlimited = predict_steps(levels, payload_bytes=payload_bytes, bandwidth_Bps=math.inf, min_rtt_s=rtt,
                                  compute_s=compute_s, overlap=overlap, per_byte_s=host)  # fmt: skip
        assert self.level is not None
        return self._law(unlimited, self.settings.eps, self.settings.tie_eps)[0] < self.level

    def observe(
        self,
        *,
        step: int,
        level: int | None,
        bytes_sent: int,
        comm_s: float,
        time_s: float | None = None,
        rtt_s: float | None = None,
        app_limited: bool | None = None,
    ) -> None:
        """Adds an application bandwidth sample (bytes over comm time less one min RTT)."""
        predicted, self._predicted_wire_s = self._predicted_wire_s, None
        self._last_send_slow = predicted is not None and comm_s > 1.5 * predicted + 0.005
        self.bandwidth.add_app_sample(
            bytes_sent=bytes_sent, comm_s=comm_s, min_rtt_s=self._min_rtt_s, app_limited=bool(app_limited)
        )
        if level is not None and 0 <= level < len(self.ladder):
            # The receiver decodes before it acknowledges (the PS acks a push once decoded), so its
            # decode is part of comm_s but not of the transport's per-byte cost.
            peer_decode = self.costs.decode_s_per_mb(level) * self._payload_bytes / 1e6
            self.transport.observe(
                level=level,
                bytes_sent=bytes_sent,
                comm_s=comm_s,
                time_s=self._now_s if time_s is None else time_s,
                min_rtt_s=self._min_rtt_s,
                peer_decode_s=peer_decode,
                queue_s=self._queue_s,
                queue_tolerance_s=self.settings.queue_tolerance_s,
            )

    def rechoose(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        """The law again, mid-push, with the push so far as a bandwidth sample (its pipe is full:
        bytes wait unsent). Only a move to a heavier level is returned, and it is committed as if
        `choose` had made it: a rate drop that lands while a step computes is otherwise seen only
        by the push after the slow one (docs/BENCHMARKS.md, rate step). No step is counted."""
        s, index = self.settings, sent.level
        if index is None or self.level is None or elapsed_s <= 0:
            return None
        self.bandwidth.add_app_sample(
            bytes_sent=bytes_acked, comm_s=elapsed_s, min_rtt_s=self._min_rtt_s, app_limited=False
        )
        bw = self.effective_bandwidth(link)
        if bw is None:
            return None
        self._now_s = link.time_s
        levels, per_byte, rtt = self._levels_now(), self._per_byte_s(), link.min_rtt_s or 0.0
        preds = predict_steps(levels, payload_bytes=sent.payload_bytes, bandwidth_Bps=bw, min_rtt_s=rtt,
                              compute_s=sent.compute_s, overlap=sent.overlap, per_byte_s=per_byte)  # fmt: skip
        target, ok = self._law(preds, s.eps, s.tie_eps)
        if index in ok or target <= index:
            return None
        if target > self.level:
            self._go_heavier(target, bw)
        self._predicted_wire_s = None  # the withdrawn push is not observed
        cost = lambda i: preds[i] / self._q(i)  # noqa: E731
        decision = self._decision(
            level_index=target,
            level=levels[target],
            reason=f"re-decide: {sent.spec} push slow ({elapsed_s:.3g}s, {bytes_acked} B acked), "
            f"C_{index}={cost(index):.4g}s, C*={min(map(cost, range(len(preds)))):.4g}s",
            link=link,
            bandwidth_Bps=bw,
            payload_bytes=sent.payload_bytes,
            compute_s=sent.compute_s,
            overlap=sent.overlap,
            step=sent.step,
            progress=self._q(target),
            progress_levels=tuple(self.progress.values),
            per_byte_s=per_byte,
            predicted_levels=tuple(preds),
        )
        return self._sent(decision, bw, rtt)

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        """Folds a timing of `level` into its measured costs (median of the last `cost_window`)."""
        self.costs.observe(level, dense_bytes=dense_bytes, encode_s=encode_s, decode_s=decode_s)


    def observe_progress(self, *, level: int, progress: float) -> None:
        """Folds a measured q of `level` into its EWMA (the first measurement replaces the prior)."""
        if 0 <= level < len(self.ladder) and math.isfinite(progress):
            self.progress.update(level, progress)

    def progress_candidates(self, step: int) -> list[int]:
        """Every lossy level, every `progress_every` steps (from step 0) within `progress_budget` of
        the time: priors are worst-case bounds, so a level is judged on its measured q before long,
        whether used or not. Asked again for the same step, it answers the same."""
        s = self.settings
        if not s.progress_aware or s.progress_every <= 0 or step % s.progress_every:
            return []
        levels = [i for i, lv in enumerate(self.ladder) if not lv.lossless]
        last = self._round
        if last is not None and last[0] != step and s.progress_budget > 0:
            sample = min(self._payload_bytes, 4 * DEFAULT_SAMPLE_NUMEL)
            cost = sum(self.costs.level(i).codec_s(sample) for i in levels)
            if (self._now_s - last[1]) * s.progress_budget < cost:
                return []
        if last is None or last[0] != step:
            self._round = (step, self._now_s)
        return levels


register_policy("netsense", _settings_factory("netsense", NetsensePolicy, NetsensePolicySettings))

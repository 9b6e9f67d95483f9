"""What a policy is asked, what it answers and what it hears back, and the step-time model.

One request type (`ChooseRequest`) goes into every `Policy.choose`, so the policies, their callers
and the mid-push redecide pass one value instead of repeating five keywords; one `Decision` comes
out, with the prediction it was based on and its decision-log record (docs/POLICIES.md); one
`SendReport` goes back into `Policy.observe` with what the send really cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .ladder import Level
from .link import LinkState


@dataclass(frozen=True, kw_only=True)
class ChooseRequest:
    """One question to a policy: the level for `step`, on the path `link` shows.

    Checked when made, so no policy has to check its inputs again."""

    link: LinkState
    """The path as the sender sees it now."""
    payload_bytes: int
    """Dense fp32 bytes of the step (S)."""
    compute_s: float
    """Measured compute time (Tc) the communication is weighed against."""
    step: int
    """Training step the decision is for."""
    overlap: bool = False
    """Whether communication overlaps compute (P_l = max(Tc, T_l) instead of Tc + T_l)."""
    pad_ok: bool = False
    """Whether the sender can add filler to this send (`Decision.pad_bytes`): a probe then pads the
    committed level's send to a bandwidth sample instead of sending a lighter level."""
    wire_passes: int = 1
    """How many times a level's bytes cross a path like this one per step: 2 when a
    gradient-domain PS sends the step back at the level each key was pushed in (`Policy.passes`);
    the predicted wire time is that many sends."""
    return_share: float = 1.0
    """What a byte of the update costs on its way back, in a pushed byte's time (`byte_s`): the
    sends after the first are priced at this many times the push's. Measured by the policy
    (`ReturnShare`: ~n where n workers' copies cross one bottleneck at once); 1 until then."""
    overhead_s: float = 0.0
    """The step's time that the model leaves out, the same at every level (the policy measures it:
    `StepOverhead`); added to every P_l after compute and communication."""

    def __post_init__(self) -> None:
        if self.payload_bytes < 0:
            raise ValueError(f"payload_bytes must be >= 0, got {self.payload_bytes}")
        if self.wire_passes < 1:
            raise ValueError(f"wire_passes must be >= 1, got {self.wire_passes}")
        if not (math.isfinite(self.return_share) and self.return_share > 0):
            raise ValueError(f"return_share must be finite and > 0, got {self.return_share}")
        if not (math.isfinite(self.compute_s) and self.compute_s >= 0):
            raise ValueError(f"compute_s must be finite and >= 0, got {self.compute_s}")
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise ValueError(f"overhead_s must be finite and >= 0, got {self.overhead_s}")


@dataclass(frozen=True, kw_only=True)
class SendReport:
    """What one send really cost, fed back to the policy that chose it (`Policy.observe`)."""

    step: int
    """Training step of the send."""
    level: int | None
    """Ladder level sent (the decision's), None for an off-ladder spec."""
    bytes_sent: int
    """Wire bytes sent."""
    comm_s: float
    """First byte sent to acknowledgement, codec time excluded."""
    time_s: float | None = None
    """Link time of the send; None: the last link snapshot's."""
    rtt_s: float | None = None
    """An application-measured RTT sample, if any."""
    app_limited: bool | None = None
    """True for a send known not to fill the pipe."""
    pad_bytes: int = 0
    """Filler bytes (`Decision.pad_bytes`) included in `bytes_sent`."""
    returned: tuple[int, float] | None = None
    """An update's return as the PS timed it (`Ack.delivered_s`): (one copy's wire bytes, seconds
    from its first copy written to its last delivered); None when not reported."""


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
    ``unknown-bandwidth``, ``fixed``, ``paper``, ``dc2``, ``accordion``, ``gravac``) and short
    details."""
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
    jitter: float | None = None
    """The measured step's relative jitter, the floor of a move's band (netsense), else None."""
    pad_bytes: int = 0
    """Filler to send beside the step's payload (a probe: the send becomes a bandwidth sample; the
    receiver drops it), only when the request allowed it (`ChooseRequest.pad_ok`)."""
    return_share: float = 1.0
    """The request's `ChooseRequest.return_share` the prediction used."""
    overhead_s: float = 0.0
    """The request's `ChooseRequest.overhead_s` the prediction used."""

    def request(self, link: LinkState) -> ChooseRequest:
        """The request this decision answered, asked again on the path as `link` shows it now."""
        return ChooseRequest(
            link=link, payload_bytes=self.payload_bytes, compute_s=self.compute_s, step=self.step, overlap=self.overlap,
            return_share=self.return_share, overhead_s=self.overhead_s,
        )

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
            "jitter": self.jitter,
            "pad_bytes": self.pad_bytes,
            "return_share": self.return_share,
            "overhead_s": self.overhead_s,
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
    """Predicted cost of sending one level this step (the step-time model of docs/POLICIES.md)."""

    comm_s: float
    """T_l = r_l * S * max(1 / B, c) * (1 + (passes - 1) * share) + min_rtt + e_l (c: measured seconds
    per wire byte, 0 if unknown; share: `ChooseRequest.return_share`)."""
    step_s: float
    """P_l = Tc + T_l, or max(Tc, T_l) when communication overlaps compute, plus the worker's
    decode of an update that comes back at the level (`wire_passes` > 1: `Level.return_s`) and
    the request's `overhead_s`."""


def byte_s(bandwidth_Bps: float, per_byte_s: float | None = 0.0) -> float:
    """Seconds a wire byte takes: the link's 1 / B, or the transport's measured cost per byte
    (`TransportCost`) where the hosts, not the link, bound the rate."""
    return max(1.0 / bandwidth_Bps, per_byte_s or 0.0)


def predict(
    level: Level,
    *,
    payload_bytes: int,
    bandwidth_Bps: float,
    min_rtt_s: float,
    compute_s: float,
    overlap: bool,
    per_byte_s: float = 0.0,
    wire_passes: int = 1,
    return_share: float = 1.0,
    overhead_s: float = 0.0,
) -> Prediction:
    """The step-time model for one level; `per_byte_s` is the transport's measured cost of a
    wire byte (`TransportCost`), which bounds the rate where the hosts, not the link, limit it;
    `wire_passes` sends of its bytes per step (`ChooseRequest.wire_passes`), those after the
    first at `return_share` times a pushed byte's time, the update then decoded at the level
    after the wait (outside Tc and T_l); `overhead_s` the step's unmodelled time."""
    sends = 1 + (wire_passes - 1) * return_share
    wire_s = sends * level.wire_bytes(payload_bytes) * byte_s(bandwidth_Bps, per_byte_s)
    comm = wire_s + min_rtt_s + level.codec_s(payload_bytes)
    back_s = level.return_s(payload_bytes) if wire_passes > 1 else 0.0
    return Prediction(comm, (max(compute_s, comm) if overlap else compute_s + comm) + back_s + overhead_s)


def predict_request(
    level: Level, request: ChooseRequest, *, bandwidth_Bps: float, per_byte_s: float = 0.0
) -> Prediction:
    """`predict` for `request` (its payload, compute time, overlap and the link's min RTT)."""
    return predict(
        level,
        payload_bytes=request.payload_bytes,
        bandwidth_Bps=bandwidth_Bps,
        min_rtt_s=request.link.min_rtt_s or 0.0,
        compute_s=request.compute_s,
        overlap=request.overlap,
        per_byte_s=per_byte_s,
        wire_passes=request.wire_passes,
        return_share=request.return_share,
        overhead_s=request.overhead_s,
    )


def predict_steps(
    levels: list[Level], request: ChooseRequest, *, bandwidth_Bps: float, per_byte_s: float = 0.0
) -> list[float]:
    """P_l of every level in `levels` for `request` at `bandwidth_Bps`."""
    return [predict_request(lv, request, bandwidth_Bps=bandwidth_Bps, per_byte_s=per_byte_s).step_s for lv in levels]

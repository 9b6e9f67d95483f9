"""The interface every policy implements: a small synchronous state machine, no clock, no I/O.

`choose` answers a `ChooseRequest` with a `Decision`; `observe` (a `SendReport`) and the other
`observe_*` feed back what a send really cost; `redecide` may move a slow push heavier mid-flight. Time arrives in
`LinkState.time_s` or as an argument, so policies run on synthetic sequences in tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .decision import ChooseRequest, Decision, SendReport, predict_request
from ..window import WindowResult
from .ladder import Ladder, Level, level_for
from .link import LinkState


class Policy(ABC):
    """Picks a codec level per step from the link state; learns from `observe` feedback."""

    def __init__(self, ladder: Ladder, *, name: str) -> None:
        self.ladder = ladder
        """The levels this policy chooses among."""
        self.name = name
        """The spec this policy was made from (goes into every decision)."""
        self.passes = 1
        """How many times the chosen level's bytes cross the path a step: 2 when a gradient-domain
        PS sends the step's gradient back at the level each key was pushed in (docs/POLICIES.md,
        "A gradient-domain downlink"), compressed again or as the pushes themselves. A policy that
        prices time (netsense) sends the level's bytes `passes` times; the others ignore it."""
        self.compressions = 1
        """How many times the chosen level compresses the stream on its way to the model: 2 when
        the PS compresses the mean again, 1 when it forwards the pushes (docs/ARCHITECTURE.md,
        "Forwarded pushes"). A policy that prices progress (netsense) prices a level at
        q ** compressions; the others ignore it."""
        self.step_spec: str | None = None
        """The level of the last gradient-domain step's smallest push where another worker sent it
        (None: this worker's own, or not known). netsense joins it where it holds by its own costs
        (docs/POLICIES.md, "Joining the step's level"); the others ignore it."""
        self.step_intents: tuple[str, ...] = ()
        """The other workers' intents of the last gradient-domain step (`Params.intents`: where each
        one's policy is heading; empty: not known). netsense meets them there (docs/POLICIES.md,
        "Where the others are heading"); the others ignore it."""
        self.join_compressions = 1
        """`compressions` for the `step_spec` level: 1 where the PS has forwarded pushes (a step at
        the other worker's level is forwarded again), else `compressions`."""
        self._levels: dict[str, Level] = {}

    @abstractmethod
    def choose(self, request: ChooseRequest) -> Decision:
        """Decide the level for `request.step`; its `payload_bytes` is the dense fp32 size S,
        its `compute_s` Tc."""

    def intent(self) -> str | None:
        """The ladder spec of the level this policy is heading for, which the other workers of a
        gradient-domain step are told (`Push.intent`); None (the default): not said."""
        return None

    def observe(self, report: SendReport) -> None:
        """Feedback after a send: `report.bytes_sent` wire bytes took `report.comm_s` (first byte to
        ack, codec time excluded). The default ignores feedback; adaptive policies override."""

    def probe_bytes(self, payload_bytes: int) -> int:
        """Bytes the sender should push through the path before its first decision, so that decision
        has a bandwidth to weigh (its result goes to `observe_probe`). Default: 0, no probe."""
        return 0

    def observe_probe(self, *, bytes_sent: int, comm_s: float, min_rtt_s: float | None) -> None:
        """The start-up probe asked for by `probe_bytes`: `bytes_sent` took `comm_s` from first byte
        to ack. Default: ignored."""

    def redecide(self, *, link: LinkState, sent: Decision, bytes_acked: int, elapsed_s: float) -> Decision | None:
        """Mid-push: the push of `sent` has run `elapsed_s` (first byte on) and `bytes_acked` of it
        arrived, with bytes still unsent; `link` is the path now. A decision for a heavier level
        means: withdraw the unsent part and send this step at that level instead (error feedback
        keeps that exact); None lets the push finish. Default: None (the level stands)."""
        return None

    def observe_progress(self, *, level: int, progress: float, interim: bool = False) -> None:
        """A measured progress efficiency q of ladder level `level` (docs/POLICIES.md): from the
        level just sent, or from a candidate measured on a gradient sample. `interim`: a figure
        that stands in for the level's prior only until its first ordinary one (the downlink's
        round on a fresh model's first update, `netsense.ps.downlink`). Default: ignored."""

    def provisional(self) -> None:
        """The decision just taken was made on figures the next will have better (the downlink's
        update 0: no compute time yet, q from that one update): the next is made afresh, no
        hysteresis holding this one. Default: nothing (no policy state to release)."""

    def progress_candidates(self, step: int) -> list[int]:
        """Ladder levels whose q the caller should measure on this step's gradient (cheaply, off the
        critical path) and report with `observe_progress`. Default: none."""
        return []

    def progress_window(self, step: int) -> tuple[list[int], int]:
        """Ladder levels to run a progress window for (`netsense.compression.window`: error feedback
        on a fixed subsample of the gradients fed from `step` on, 1.5 W steps), and W. Asked only while
        no window runs. Default: none."""
        return [], 0

    def observe_window(self, result: WindowResult) -> None:
        """What a progress window measured: q_W per level and the gradient noise scale. Default: ignored."""

    sent_window_steps: int = 0
    """W of the sent level's window (`netsense.compression.sentwindow`: q_W of the level sent, from
    the sender's own error feedback, each W steps at one level); 0: the sender keeps no such sums."""

    def observe_sent_window(self, *, level: int, progress: float) -> None:
        """q_W of ladder level `level` over the last `sent_window_steps` steps it was sent, from the
        sender's own error feedback. Default: ignored."""

    def observe_ratio(self, *, level: int, ratio: float) -> None:
        """The wire ratio of ladder level `level` measured on the run's own tensor shapes (a
        low-rank codec's depends on them). Default: ignored (the ladder's nominal ratio stands)."""

    wants_gradient_norm: bool = False
    """Whether the caller should compute each step's gradient norm for `observe_gradient` (a pass
    over the gradient, so only for the policies that read it)."""

    def observe_gradient(self, *, step: int, norm: float) -> None:
        """The L2 norm of step `step`'s local gradient, before compression and error feedback.
        Default: ignored (only read where `wants_gradient_norm`)."""

    wants_round_norms: bool = False
    """Whether the uplink should report, with each candidate round, the norms of the step's plain
    gradient and of the error-feedback-corrected input the round measured (`observe_round_norms`):
    two passes over the gradient, so only for the policies that read them."""

    def observe_round_norms(self, *, step: int, gradient_norm: float, input_norm: float) -> None:
        """||g|| and ||g + r|| of step `step`, whose candidate round measures q on g + r next.
        Default: ignored (only sent where `wants_round_norms`)."""

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        """A timing of ladder level `level`: `encode_s` / `decode_s` seconds for `dense_bytes` of
        fp32 input (either may be None). Default: ignored (the ladder's figures stand)."""

    def observe_return(self, *, level: int, dense_bytes: int, decode_s: float) -> None:
        """The worker's decode of an update that came back at ladder level `level`: `decode_s`
        seconds for `dense_bytes` of fp32. Default: ignored."""

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
        request: ChooseRequest,
        *,
        level_index: int | None,
        level: Level,
        reason: str,
        bandwidth_Bps: float | None,
        progress: float | None = None,
        progress_levels: tuple[float, ...] | None = None,
        per_byte_s: float = 0.0,
        predicted_levels: tuple[float, ...] | None = None,
        jitter: float | None = None,
        pad_bytes: int = 0,
    ) -> Decision:
        """The decision to send `level` for `request`, with its prediction at `bandwidth_Bps`."""
        comm = step_s = None
        if bandwidth_Bps is not None and bandwidth_Bps > 0:
            pred = predict_request(level, request, bandwidth_Bps=bandwidth_Bps, per_byte_s=per_byte_s)
            comm, step_s = pred.comm_s, pred.step_s
        return Decision(
            level=level_index,
            spec=level.spec,
            predicted_comm_s=comm,
            predicted_step_s=step_s,
            reason=reason,
            step=request.step,
            payload_bytes=request.payload_bytes,
            predicted_bytes=round(level.wire_bytes(request.payload_bytes)),
            compute_s=request.compute_s,
            overlap=request.overlap,
            bandwidth_Bps=bandwidth_Bps,
            policy=self.name,
            progress=progress,
            progress_levels=progress_levels,
            predicted_levels=predicted_levels,
            per_byte_s=per_byte_s,
            jitter=jitter,
            pad_bytes=pad_bytes,
            return_share=request.return_share,
            overhead_s=request.overhead_s,
        )

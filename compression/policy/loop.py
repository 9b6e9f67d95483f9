"""The bookkeeping around a policy that the uplink and the downlink share, sans I/O.

Each direction runs the same cycle: time the compute between sends (an EWMA), ask the policy for a
level, feed back what the send cost and the encode took (skipping a level's first encode, which
pays lazy set-up), measure candidate levels on a gradient sample, count the levels sent, write the
decision log, and run the progress windows (`netsense.compression.window`) on the stream of
gradients (the uplink) or of parameters (the downlink, whose steps are their changes). `PolicyLoop` is that cycle; `netsense.worker.uplink` and `netsense.ps.downlink` read
the connections and clocks and hand it plain values.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from ..base import Codec, make_codec
from ..progress import WARM_UP_NUMEL, measure_level
from ..window import WindowProbe, WindowResult
from .base import Policy
from .decision import ChooseRequest, Decision, SendReport
from .decisionlog import DecisionLog
from .link import LinkState
from .progress import LevelObserver, measure_into

COMPUTE_EWMA_ALPHA = 0.3
"""Weight of the newest compute-time sample (the time between one send and the next, less the
send): a few steps smooth out scheduler noise."""


class RoundObserver(LevelObserver, Protocol):
    """What a candidate round reports to: a policy, or a `RoundRecord` to replay into one later."""

    def observe_ratio(self, *, level: int, ratio: float) -> None: ...


class RoundRecord:
    """A candidate round's reports, kept to be handed to the policy later on its own thread: the
    PS measures its rounds on the window thread, and its policy is only ever touched by the loop."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        """(method name, keyword arguments) in the order the round made them."""

    def observe_costs(self, **kwargs: Any) -> None:
        self.calls.append(("observe_costs", kwargs))

    def observe_progress(self, **kwargs: Any) -> None:
        self.calls.append(("observe_progress", kwargs))

    def observe_ratio(self, **kwargs: Any) -> None:
        self.calls.append(("observe_ratio", kwargs))

    def replay(self, policy: Policy) -> None:
        """Make the recorded calls on `policy`, in order."""
        for name, kwargs in self.calls:
            getattr(policy, name)(**kwargs)


class PolicyLoop:
    """One direction's policy with its compute-time EWMA, level histogram, candidate codecs and log."""

    def __init__(
        self,
        policy: Policy,
        *,
        direction: str,
        decision_log: str | Path | None = None,
        log_fields: dict[str, Any] | None = None,
        pads: bool = False,
        precondition: bool = False,
    ) -> None:
        self.policy = policy
        self.pads = pads
        """Whether the caller sends a decision's `pad_bytes` of filler beside its payload (and counts
        them in `observe`'s `bytes_sent`): the policy may then probe by padding."""
        self.precondition = precondition and direction == "up"
        """The gradients sent are applied by an optimizer that scales each coordinate by its second
        moment (Adam): the windows price levels in its metric (`WindowProbe`'s `precondition`).
        The downlink sends parameter updates, already in the space the model moves in."""
        self.compute_s: float | None = None
        """EWMA of the compute time between sends, None before the first sample."""
        self.levels: dict[str, int] = {}
        """Sends at each codec spec (the level histogram)."""
        self.codecs: dict[int, Codec] = {}
        """Candidate codecs per ladder level, warmed up: own instances, since stateful codecs keep
        their state and the sends' codecs must not see the samples."""
        self.log = DecisionLog(decision_log, direction=direction, extra=log_fields) if decision_log else None
        self._warm: set[int] = set()  # levels encoded once: their first encode paid lazy set-up
        self._warm_return: set[int] = set()  # levels decoded once as an update (as `_warm`)
        self.window: WindowProbe | None = None
        """The progress window under way, None between windows."""
        self._cumulative = direction == "down"  # the downlink feeds parameters, not gradients
        self._windows = 0  # progress windows started
        self._first_window: WindowProbe | None = None  # the run's first (its results are `first`)

    def time_compute(self, sample_s: float) -> None:
        """Fold one compute-time sample into the EWMA."""
        a = COMPUTE_EWMA_ALPHA
        self.compute_s = sample_s if self.compute_s is None else a * sample_s + (1 - a) * self.compute_s

    def restart_compute(self) -> None:
        """Forget the compute-time EWMA: the next sample starts it afresh (a first sample that held
        one-off set-up, `netsense.ps.downlink`)."""
        self.compute_s = None

    def choose(self, link: LinkState, *, payload_bytes: int, step: int, compute_s: float | None = None) -> Decision:
        """The policy's decision for `step`, weighed against the compute time so far (0 before any),
        or against `compute_s` when the caller has a better figure for this one decision."""
        compute = compute_s if compute_s is not None else self.compute_s or 0.0
        return self.policy.choose(
            ChooseRequest(link=link, payload_bytes=payload_bytes, compute_s=compute, step=step, pad_ok=self.pads)
        )

    def count(self, spec: str) -> None:
        """One send at `spec`, for the level histogram."""
        self.levels[spec] = self.levels.get(spec, 0) + 1

    def observe_encode(self, level: int, dense_bytes: int, encode_s: float) -> None:
        """The timed encode of a send at ladder level `level`, as its measured encode cost; the
        first at each level is skipped (it builds and warms the codecs: 2-10x the later timings)."""
        if level not in self._warm:
            self._warm.add(level)
            return
        self.policy.observe_costs(level=level, dense_bytes=dense_bytes, encode_s=encode_s)

    def observe_return(self, level: int, dense_bytes: int, decode_s: float) -> None:
        """The timed decode of an update that came back at ladder level `level`; the first at each
        level is skipped, as for `observe_encode` (the codec's lazy set-up)."""
        if level not in self._warm_return:
            self._warm_return.add(level)
            return
        self.policy.observe_return(level=level, dense_bytes=dense_bytes, decode_s=decode_s)

    def observe(
        self,
        decision: Decision,
        *,
        bytes_sent: int,
        comm_s: float,
        pad_bytes: int = 0,
        returned: tuple[int, float] | None = None,
    ) -> None:
        """What the send of `decision` cost: `bytes_sent` wire bytes (`pad_bytes` of them filler) in
        `comm_s`; `returned`: an update's return as the PS reported it (`SendReport.returned`)."""
        self.policy.observe(
            SendReport(
                step=decision.step, level=decision.level, bytes_sent=bytes_sent, comm_s=comm_s, pad_bytes=pad_bytes,
                returned=returned,
            )
        )

    def warm_up(self, levels: list[int], tensors: list[torch.Tensor], observer: RoundObserver | None = None) -> None:
        """Build the candidate codecs of `levels` and call each once on a small sample of `tensors`;
        what that learns (wire ratios) goes to `observer` (default: the policy)."""
        for level in levels:
            self._codec(level, tensors, observer or self.policy)

    def measure(
        self,
        levels: list[int],
        tensors: list[torch.Tensor],
        observer: RoundObserver | None = None,
        weights: list[torch.Tensor] | None = None,
    ) -> dict[int, float]:
        """Measure q and the codec times of each of `levels` on `tensors` (q in the metric
        `weights`, per tensor: `measure_level`) and feed them to `observer` (default: the policy;
        warming a codec up first if it is new); returns the q measured per level."""
        obs = observer or self.policy
        measured = {}
        for level in levels:
            q = measure_into(obs, level, self._codec(level, tensors, obs), tensors, weights)
            if q is not None:
                measured[level] = q
        return measured

    def window_due(self, step: int) -> bool:
        """Whether `feed_window` wants this step's tensors: a window is under way, or the policy
        starts one at `step` (`Policy.progress_window`)."""
        if self.window is None:
            levels, steps = self.policy.progress_window(step)
            if not levels or steps < 2:
                return False
            specs = {level: self.policy.ladder[level].spec for level in levels}
            # The first window starts with the run, whose own residuals are zero too: nothing to
            # warm, so its interim figure comes W/4 steps in, not W/2 + W/4 (docs/POLICIES.md).
            warm = 0 if self._windows == 0 else None
            self.window = WindowProbe(
                specs, window=steps, cumulative=self._cumulative, warm=warm, precondition=self.precondition
            )
            if self._windows == 0:
                self._first_window = self.window
            self._windows += 1
        return True

    def feed_window(self, tensors: list[torch.Tensor]) -> WindowResult | None:
        """One step of the window under way (the uplink's gradients, the downlink's parameters, per
        key); an interim result and the final one go to the policy (`Policy.observe_window`) and
        are returned."""
        if self.window is None:
            return None
        return self.window_result(self.window, self.window.feed(tensors))

    def window_result(self, probe: WindowProbe, result: WindowResult | None) -> WindowResult | None:
        """What `probe`'s feed returned, fed to the policy (an interim or the final result; the
        final one ends the window if `probe` is still the one under way). Separate from
        `feed_window` for a caller that feeds on another thread (`netsense.ps.downlink`)."""
        if result is not None:
            if not result.interim and self.window is probe:
                self.window = None
            if probe is self._first_window:
                result = replace(result, first=True)
            self.policy.observe_window(result)
        return result

    def _codec(self, level: int, tensors: list[torch.Tensor], observer: RoundObserver) -> Codec:
        """The candidate codec of `level`; a new one is called once on a small sample of `tensors`
        first: a first call pays lazy set-up (2-10x), which must not count as the level's cost.
        A new one also reports the level's wire ratio on the tensors' real shapes (`measure_ratio`)."""
        codec = self.codecs.get(level)
        if codec is None:
            codec = self.codecs[level] = make_codec(self.policy.ladder[level].spec)
            measure_level(codec, tensors, max_numel=WARM_UP_NUMEL, whole_keys=False)
            ratio = measure_ratio(self.policy.ladder[level].spec, tensors)
            if ratio is not None:
                observer.observe_ratio(level=level, ratio=ratio)
        return codec

    def write(
        self, decision: Decision, link: LinkState, *, bytes_sent: int | None, comm_s: float | None, **fields: Any
    ) -> dict[str, Any] | None:
        """The decision-log line of `decision` (returned), None when there is no log."""
        if self.log is None:
            return None
        return self.log.write(decision, link, bytes_sent=bytes_sent, comm_s=comm_s, **fields)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def measure_ratio(spec: str, tensors: list[torch.Tensor]) -> float | None:
    """Wire bytes over fp32 bytes of `spec` on random tensors of `tensors`' shapes, each key on its
    own (a fresh codec): a low-rank codec's ratio depends on the shapes, which subsamples distort.
    One full-size encode per level, once per run; None for no elements."""
    dense = sum(4 * t.numel() for t in tensors)
    if dense == 0:
        return None
    codec, gen = make_codec(spec), torch.Generator().manual_seed(0)
    wire = sum(codec.encode(torch.randn(t.shape, generator=gen)).wire_size for t in tensors if t.numel() > 0)
    return wire / dense

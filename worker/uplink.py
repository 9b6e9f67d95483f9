"""The worker's uplink policy loop: per step, read the link, choose a level, log what it cost.

`UplinkController` glues the pure policy (`netsense.compression.policy`) to a live connection:
it reads the `NetworkSignal` of the worker's QUIC connection, times the compute between the end
of one `step()` and the start of the next, and hands both to the shared `PolicyLoop` (which asks
the policy for this step's codec, feeds back what the push really cost and writes one
decision-log line). What is the uplink's own: the start-up masking, the sharded link, and the
mid-push redecide.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from netsense.compression.policy import Decision, Policy
from netsense.compression.policy.decision import byte_s
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import PolicyLoop
from netsense.transport.sensing.estimator import SensingConfig
from netsense.transport.sensing.signal import SignalReader

log = logging.getLogger(__name__)

SENSING = SensingConfig(bandwidth_window_s=0.25)
"""Bandwidth max over 10 RTTs with a 0.25 s floor (BBR's filter), not the 2 s default: the filter
slides with sample time, and a push is one burst after a compute gap, so each push is measured
afresh and a rate drop shows at the next step (with 2 s it took 2-3 steps of ~1 s to show)."""


PROGRESS_START_STEP = 0
"""First step of the candidate rounds (then every `progress_every`). A round runs before the choice
of its own step and before that step's push leaves (`NetSenseOptimizer.step`), so the first one, at
step 0, prices every level on the run's first gradient before anything is sent: with the 8-bit
level measured lossless the steps of unknown bandwidth go out at it instead of fp16, and the first
step with a known bandwidth already has PowerSGD's measured q instead of its 0.05 prior
(docs/history/BENCHMARKS-2026.md, "Rounds before the choice, and off the PS's loop"). It was step 2 while rounds
ran after the choice and, before that, on the wire, where they delayed the first samples' acks."""
STARTUP_STEPS = 1
"""Pushes that are not bandwidth evidence: the first one runs in slow start right after the
handshake, so it is not fed back to the policy, nor is its wait for the first update counted in
Tc, and the link's own estimate stays masked for the next decision too (its window still holds that push: 4.6 Mbit/s was seen on an idle loopback,
which sent one worker to top-k for 5 steps)."""


class UplinkController:
    """One worker's adaptive uplink: choose before encoding, observe after the push."""

    def __init__(
        self,
        policy: Policy,
        *,
        payload_bytes: int,
        decision_log: str | Path | None = None,
        log_fields: dict[str, Any] | None = None,
        pads: bool = False,
        precondition: bool = False,
    ) -> None:
        self.loop = PolicyLoop(
            policy, direction="up", decision_log=decision_log, log_fields=log_fields, pads=pads, precondition=precondition
        )
        """The policy and the bookkeeping the downlink shares (compute EWMA, histogram, log)."""
        self.payload_bytes = payload_bytes
        """Dense fp32 bytes of every key (S)."""
        self._reader: SignalReader | None = None
        self._reader_quic: Any = None
        self._shard_readers: dict[int, tuple[Any, SignalReader]] = {}
        self._last_end: float | None = None
        self._ready_at: float | None = None  # when the first parameters arrived (`ready`): step 0's compute starts
        self._waited_s = 0.0  # the last step's wait for its update (push acked to update received)
        self._pending: tuple[Decision, LinkState] | None = None
        self._step = 0
        self.last: tuple[Decision, LinkState] | None = None
        """The latest decision and the link state it was taken on."""
        self.withdrawals = 0
        """Pushes withdrawn mid-flight and re-encoded at a heavier level (`withdrawn`)."""
        self._redecide: str | None = None  # how the pending push's redecide ended, for its log line
        self._probe: dict[str, Any] | None = None  # the start-up probe's figures (`observe_probe`)

    @property
    def policy(self) -> Policy:
        """The uplink's policy (the loop's)."""
        return self.loop.policy

    @property
    def compute_s(self) -> float | None:
        """EWMA of the compute time between steps, None before the second step."""
        return self.loop.compute_s

    @property
    def levels(self) -> dict[str, int]:
        """Steps sent at each codec spec (the level histogram)."""
        return self.loop.levels

    def read_link(self, quic: Any) -> LinkState:
        """Snapshot of `quic`'s path; call on the thread that runs the connection's loop."""
        if self._reader is None or self._reader_quic is not quic:  # a reconnect makes a new connection
            self._reader, self._reader_quic = SignalReader(quic, SENSING), quic
        signal = self._reader.read()
        link = signal.to_link_state()
        # Until the connection has carried one dense payload, its samples come from handshake-sized
        # bursts (seen: 70 kB/s on loopback); until one step is timed there is no compute time to
        # weigh communication against. Either way the policy gets "bandwidth unknown" (safe level).
        if signal.delivered_bytes < self.payload_bytes or self._last_end is None or self._step <= STARTUP_STEPS:
            link = replace(link, bandwidth_Bps=None)
        return link

    def read_shards(self, quics: list[Any], shares: list[float]) -> LinkState:
        """Sharded push: the path that bounds it, as one link for the whole payload.

        Shard i carries `shares[i]` of the payload over its own connection, in parallel with the
        others, so the push takes max_i(share_i * S / B_i) = S / min_i(B_i / share_i): the policy
        sees that connection's state with bandwidth B_i / share_i (the rate at which the whole
        payload moves). Unknown on any shard (too little carried yet) is unknown for the push.
        """
        best: LinkState | None = None
        for i, (quic, share) in enumerate(zip(quics, shares, strict=True)):
            cached = self._shard_readers.get(i)
            if cached is None or cached[0] is not quic:  # a reconnect makes a new connection
                cached = self._shard_readers[i] = (quic, SignalReader(quic, SENSING))
            signal = cached[1].read()
            link = signal.to_link_state()
            share = max(share, 1e-9)
            if (
                link.bandwidth_Bps is None
                or signal.delivered_bytes < share * self.payload_bytes
                or self._last_end is None
                or self._step <= STARTUP_STEPS
            ):
                return replace(link, bandwidth_Bps=None)
            link = replace(link, bandwidth_Bps=link.bandwidth_Bps / share)
            if best is None or link.bandwidth_Bps < best.bandwidth_Bps:  # type: ignore[operator]
                best = link
        assert best is not None, "no shard connections"
        return best

    def probe_bytes(self) -> int:
        """Filler bytes to push before the first decision (`Policy.probe_bytes`; 0: none)."""
        return self.policy.probe_bytes(self.payload_bytes) if self._step == 0 and self._probe is None else 0

    def observe_probe(self, *, bytes_sent: int, comm_s: float, link: LinkState, source: str = "probe") -> None:
        """The start-up probe's result, for the policy; its figures go into step 0's log line.
        `source`: what was sent (``probe``: filler; ``init``: rank 0's INIT, `Exchange._start`)."""
        self._probe = {"probe_bytes": bytes_sent, "probe_s": comm_s, "probe_source": source}
        self.policy.observe_probe(bytes_sent=bytes_sent, comm_s=comm_s, min_rtt_s=link.min_rtt_s)
        log.info("uplink probe (%s): %d B in %.3f s (%.1f Mbit/s)", source, bytes_sent, comm_s, 8e-6 * bytes_sent / max(comm_s, 1e-9))

    def choose(self, link: LinkState, *, started: float | None = None) -> Decision:
        """This step's decision; `started` is when `step()` began (perf_counter)."""
        started = time.perf_counter() if started is None else started
        if self._last_end is not None:
            # Tc is the step less what this direction's level costs (encode and push): the compute
            # and the last step's wait for its update, which the barrier, the PS and the downlink
            # take whatever this worker sends. Without the wait (before 2026-12-02) every level's
            # predicted step was ~60 % of the measured one on wide-mlp, which overstated how much
            # a lighter push shortens a step.
            self.loop.time_compute(max(0.0, started - self._last_end) + self._waited_s)
        first = None
        if self.loop.compute_s is None and self._ready_at is not None:
            # Step 0: no compute time yet, and weighed on its push alone the fewest bytes look best
            # however long the compute. Its own compute since the first parameters arrived stands
            # in (for this decision only: it may hold the caller's set-up), and the next decision,
            # on a measured one, is the law's afresh, no hysteresis holding this one (as the
            # downlink's update 0: docs/POLICIES.md, "Warm-up").
            first = max(0.0, started - self._ready_at)
        decision = self.loop.choose(link, payload_bytes=self.payload_bytes, step=self._step, compute_s=first)
        if first is not None:
            self.loop.policy.provisional()
        self._pending = (decision, link)
        self._redecide = None
        self.last = (decision, link)  # read by the metrics endpoint
        return decision

    def observe(
        self,
        *,
        bytes_sent: int,
        comm_s: float,
        codec_s: float | None = None,
        pad_bytes: int = 0,
        returned: tuple[int, float] | None = None,
        update_decode_s: float | None = None,
        **fields: Any,
    ) -> dict[str, Any] | None:
        """Feedback after the push of the pending decision; writes its log line (returned).
        `bytes_sent` counts the filler sent beside the payload, `pad_bytes` (`pads`); `returned`
        is the last update's delivery as the PS timed it (`StepResult.delivered`).

        `codec_s`, the seconds the step's keys took to encode on `codec_clock` (the encoder's
        `take_codec_s`), is the level's measured encode cost, timed as the candidate rounds time
        the levels not sent (the step's wall-clock ``encode_s`` also holds the choice, a round and
        the GIL waits the network thread imposes). `update_decode_s`, the seconds this step's
        update took to decode where it came back at the level sent (None: not, or not known), is
        that level's update decode against a gradient-domain PS (`Level.return_s`)."""
        if self._pending is None:
            return None
        decision, link = self._pending
        self._pending = None
        wire_s = fields.get("wire_s")
        # The first update's wait is start-up, not the cycle: its delivery runs in slow start on
        # fresh connections (1.04 s for fp16 on wide-mlp at 50 Mbit/s, where later updates took
        # 0.03 s), and as Tc it held the uplink at the safe level's size for 3 more steps.
        timed = isinstance(wire_s, float) and math.isfinite(wire_s) and self._step >= STARTUP_STEPS
        waited = max(0.0, wire_s - comm_s) if timed else 0.0
        self._waited_s = max(0.0, waited - self._second_send_s(decision, bytes_sent - pad_bytes))
        if self._step >= STARTUP_STEPS:
            if decision.level is not None and codec_s is not None:
                self.loop.observe_encode(decision.level, self.payload_bytes, codec_s)
            if decision.level is not None and update_decode_s is not None and self.policy.passes > 1:
                self.loop.observe_return(decision.level, self.payload_bytes, update_decode_s)
            self.loop.observe(decision, bytes_sent=bytes_sent, comm_s=comm_s, pad_bytes=pad_bytes, returned=returned)
        if returned is not None:
            fields["returned_bytes"], fields["returned_s"] = returned
        self.loop.count(decision.spec)
        self._step += 1
        self._last_end = time.perf_counter()
        if self._redecide is not None:
            fields.setdefault("redecide", self._redecide)
        if self._step == 1 and self._probe is not None:
            fields.update(self._probe)
        return self.loop.write(decision, link, bytes_sent=bytes_sent, comm_s=comm_s, **fields)

    def _second_send_s(self, decision: Decision, nbytes: int) -> float:
        """What the law predicts for the update's return at `decision`'s level: against a
        gradient-domain PS (`Policy.passes` > 1) every level's P_l already holds the update's bytes
        coming back at that level, so the wait for the update, which holds the return at the level
        just sent, gives that part back and the return is counted once (docs/POLICIES.md, "Wiring:
        where policies run"). 0 while the bandwidth is unknown or with one pass."""
        passes = self.policy.passes
        bw = decision.bandwidth_Bps
        if passes <= 1 or bw is None or not bw > 0 or nbytes <= 0:
            return 0.0
        return (passes - 1) * nbytes * byte_s(bw, decision.per_byte_s) * decision.return_share

    def redecide(self, link: LinkState, *, bytes_acked: int, elapsed_s: float) -> Decision | None:
        """Mid-push: ask the policy whether the pending decision's push, running `elapsed_s` with
        `bytes_acked` arrived, should give way to a heavier level (`Policy.redecide`). The push's
        log line says how it ended (``redecide``): ``kept`` (the level stands), ``all-sent`` (the
        policy moved heavier, but every byte had left: the next step has the new level) or, on
        the withdrawn push's own line, ``withdrawn``."""
        if self._pending is None:
            return None
        new = self.policy.redecide(link=link, sent=self._pending[0], bytes_acked=bytes_acked, elapsed_s=elapsed_s)
        self._redecide = "kept" if new is None else "all-sent"  # `withdrawn` overwrites the latter
        return new

    def withdrawn(self, new: Decision, link: LinkState, *, bytes_acked: int, elapsed_s: float) -> None:
        """The pending decision's push was withdrawn mid-flight and the step re-encoded with `new`:
        log the withdrawn one (``withdrawn: true``, what it had delivered) and make `new` pending."""
        if self._pending is None:
            return
        old, old_link = self._pending
        self.withdrawals += 1
        self.loop.write(old, old_link, bytes_sent=bytes_acked, comm_s=elapsed_s, withdrawn=True, redecide="withdrawn")
        self._pending = self.last = (new, link)
        self._redecide = None

    def progress_candidates(self) -> list[int]:
        """Ladder levels the policy wants measured on this step's gradient (see `measure_progress`),
        on the policy's schedule counted from `PROGRESS_START_STEP`."""
        if self._step < PROGRESS_START_STEP:
            return []
        return self.policy.progress_candidates(self._step - PROGRESS_START_STEP)

    def measure_progress(self, levels: list[int], tensors: list[Any]) -> dict[int, float]:
        """Measure q of each of `levels` on `tensors` (the error-feedback-corrected gradient of each
        key, subsampled) and feed it, with the encode and decode times, to the policy; returns the
        q measured. Costs one encode + decode of ~65k elements per level: call it while the push is
        on the wire. The timings are how levels never sent get measured costs (and the only decode
        timings the worker has: the PS decodes the uplink on the same kind of machine)."""
        return self.loop.measure(levels, tensors)

    def window_due(self) -> bool:
        """Whether this step's local gradient goes to a progress window (`feed_window`), on the
        policy's schedule from step 0: a window step (a few ms on one thread) is no candidate round
        (~0.1 s), the start-up pushes are no bandwidth evidence anyway, and until the first window's
        interim figure PowerSGD is priced by its prior (0.05): on wide-mlp at 50 Mbit/s fixed
        powersgd:2 reaches 0.9 in ~70 steps."""
        return self.loop.window_due(self._step)

    def feed_window(self, tensors: list[Any]) -> None:
        """This step's local gradient per key (before error feedback) for the window under way:
        a few encodes + decodes of a 2^14-element subsample per lossy level."""
        self.loop.feed_window(tensors)

    def observe_progress(self, level: int | None, progress: float | None) -> None:
        """The measured q of the level just sent (from error feedback's sums)."""
        if level is not None and progress is not None:
            self.policy.observe_progress(level=level, progress=progress)

    def observe_sent_window(self, level: int, progress: float) -> None:
        """q_W of the level sent over the last W steps, from error feedback's own sums
        (`netsense.compression.sentwindow`)."""
        self.policy.observe_sent_window(level=level, progress=progress)

    def observe_gradient(self, norm: float) -> None:
        """The norm of this step's local gradient, for a policy that reads it (accordion)."""
        self.policy.observe_gradient(step=self._step, norm=norm)

    def observe_round_norms(self, gradient_norm: float, input_norm: float) -> None:
        """||g|| and ||g + r|| of this step's candidate round, for a policy that reads them (gravac)."""
        self.policy.observe_round_norms(step=self._step, gradient_norm=gradient_norm, input_norm=input_norm)

    def mark_end(self) -> None:
        """The step finished (also when it was dropped): compute time counts from now."""
        self._last_end = time.perf_counter()

    def ready(self) -> None:
        """The first parameters arrived: step 0's compute counts from now (`choose`)."""
        self._ready_at = time.perf_counter()

    def close(self) -> None:
        self.loop.close()

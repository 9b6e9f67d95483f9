"""Turning a step's gradients into payloads, on the training thread.

Per-key codec instances (stateful codecs keep warm starts per key), error feedback for lossy
levels (created on the first lossy step: lossless codecs need no residuals), grouping payloads
into buckets (one stream each), and feeding the policy the progress each level makes.

A key whose local gradient holds NaN or inf is pushed as a zero gradient (under error feedback:
the residual alone) rather than not at all: the sync barrier waits for every key of every live
worker, and the PS would refuse the non-finite push whole (docs/RELIABILITY.md, "Non-finite
local gradients").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from netsense.compression import Codec, Payload, make_codec
from netsense.compression.feedback import ErrorFeedback, NonFiniteGradient
from netsense.compression.keycodecs import KeyCodecs
from netsense.compression.limits import all_finite
from netsense.compression.progress import codec_clock
from netsense.compression.sentwindow import SentWindow

from .layout import KeySlot
from .uplink import UplinkController

log = logging.getLogger(__name__)


class GradientEncoder:
    """Encodes the keys of `slots` at a level; the residuals of lossy levels live here."""

    def __init__(
        self,
        slots: list[KeySlot],
        uplink: UplinkController,
        version: Callable[[], int] = lambda: -1,
        sent_window: SentWindow | None = None,
    ) -> None:
        self.slots = slots
        self.uplink = uplink
        self.version = version
        """The step being encoded (the replica's version), for the log line of a non-finite key."""
        self.feedback: ErrorFeedback | None = None
        """Residuals of lossy steps; None until the first one."""
        self.nonfinite = 0
        """Keys pushed as zero because their local gradient held NaN or inf, since the start."""
        self._codecs = KeyCodecs()
        self._taken = (0, 0)  # (nonfinite, clamped) at the last `take_counts`
        self._codec_s = 0.0  # seconds inside `encode` (on `codec_clock`) since `take_codec_s`
        self.sent_window = sent_window
        """q_W of the level sent, from this error feedback's own sums (`sent_window_for`)."""

    def codec_for(self, key: str, spec: str) -> Codec:
        """The encoder of `key` at `spec`, per key: stateful codecs (warm starts) keep state per
        key, and one resumed after another level takes over that level's (`KeyCodecs`)."""
        return self._codecs.get(key, spec)

    def encode(self, key: str, grad: torch.Tensor, spec: str) -> tuple[Payload, torch.Tensor]:
        """The payload of `key` and what it stands for: encoding that tensor again (at another
        level, through error feedback) sends exactly what this payload would have. Timed on
        `codec_clock` (`take_codec_s`), as the candidate rounds time the levels not sent."""
        clock = codec_clock()
        t = clock()
        try:
            return self._encode(key, grad, spec)
        finally:
            self._codec_s += clock() - t

    def take_codec_s(self) -> float:
        """Seconds spent in `encode` since the last call: what a step's level cost to encode."""
        seconds, self._codec_s = self._codec_s, 0.0
        return seconds

    def _encode(self, key: str, grad: torch.Tensor, spec: str) -> tuple[Payload, torch.Tensor]:
        codec = self.codec_for(key, spec)
        try:
            if codec.lossless and self.feedback is None:
                if not all_finite(grad):
                    raise NonFiniteGradient(key, f"gradient of {key!r} has NaN/inf")
                return codec.encode(grad), grad  # with residuals left by lossy steps, feedback flushes them
            if self.feedback is None:
                self.feedback = ErrorFeedback()
            payload, sent = self.feedback.compress(key, grad, codec)
            if self.sent_window is not None and not codec.lossless:  # a lossless step ends the window (`end_sent_step`)
                self.sent_window.add(key, grad, sent)
            return payload, sent
        except NonFiniteGradient as exc:
            # compress() left the residual as it was: what goes out is zero plus that residual.
            if self.sent_window is not None:
                self.sent_window.spoil()
            self.nonfinite += 1
            log.warning("step %d: non-finite local gradient for key %r (%s); pushed as zero this step", self.version(), key, exc)
            zero = torch.zeros_like(grad)
            if codec.lossless and self.feedback is None:
                return codec.encode(zero), zero
            assert self.feedback is not None
            return self.feedback.compress(key, zero, codec)

    @property
    def clamped(self) -> int:
        """Values sent clamped to a 16-bit type's range (error feedback keeps what was cut), since the start."""
        return self.feedback.clamped if self.feedback is not None else 0

    def take_counts(self) -> tuple[int, int]:
        """(keys pushed as zero for NaN/inf, values clamped) since the last call: one step's."""
        now = (self.nonfinite, self.clamped)
        step = (now[0] - self._taken[0], now[1] - self._taken[1])
        self._taken = now
        return step

    def encode_rest(self, spec: str, payloads: dict[str, Payload], sources: dict[str, torch.Tensor] | None) -> None:
        """Encode every key not in `payloads` yet (a parameter without a gradient sends zeros);
        `sources` (when given) keeps what each payload stands for, for a re-encoding."""
        for slot in self.slots:
            if slot.key in payloads:
                continue
            grad = slot.param.grad
            g = slot.view(grad) if grad is not None else torch.zeros(slot.shape, dtype=slot.param.dtype, device=slot.param.device)
            payloads[slot.key], source = self.encode(slot.key, g, spec)
            if sources is not None:
                sources[slot.key] = source

    def gradients(self) -> list[tuple[str, torch.Tensor]]:
        """This step's local gradient of every key that has one (before error feedback): what the
        progress windows, the candidate rounds and the gradient norm read."""
        return [(slot.key, slot.view(slot.param.grad)) for slot in self.slots if slot.param.grad is not None]

    def track_progress(self, level: int | None, spec: str) -> None:
        """Feed the policy the progress efficiency q of the level just sent (error feedback's sums)
        and this step's gradient to a progress window under way (a few ms: while the push is on
        the wire)."""
        if self.uplink.policy.wants_gradient_norm:
            self.uplink.observe_gradient(self.gradient_norm())
        self.observe_progress(level, spec)
        self.end_sent_step(level, spec)
        if self.uplink.window_due():
            self.uplink.feed_window([g for _, g in self.gradients()])

    def measure_candidates(self) -> None:
        """The candidate round, when the policy asks for one this step: every candidate level
        measured on g + r, exactly what this step's encode will take in. Call it before the
        step's choice, which it informs (the first round, at step 0, prices every level before
        the first push)."""
        candidates = self.uplink.progress_candidates()
        if not candidates:
            return
        tensors = []
        for key, grad in self.gradients():
            g = grad.float()
            r = self.feedback.residual(key) if self.feedback is not None else None
            tensors.append(g + r if r is not None and r.shape == g.shape else g)
        if self.uplink.policy.wants_round_norms:
            v_sq = sum(float(torch.dot(v.reshape(-1), v.reshape(-1))) for v in tensors)
            self.uplink.observe_round_norms(self.gradient_norm(), v_sq**0.5)
        self.uplink.measure_progress(candidates, tensors)

    def gradient_norm(self) -> float:
        """L2 norm of this step's local gradient (before error feedback), for the policies that read it."""
        total = 0.0
        for _, grad in self.gradients():
            g = grad.float().reshape(-1)
            total += float(torch.dot(g, g))
        return total**0.5

    def end_sent_step(self, level: int | None, spec: str) -> None:
        """The step's keys are encoded at `spec`: a window of the sent level may be complete
        (`SentWindow`; its q_W goes to the policy)."""
        window, feedback = self.sent_window, self.feedback
        if window is None:
            return
        if level is None or feedback is None or _kind(spec).lossless:
            window.end_step(None, feedback.residual if feedback is not None else lambda key: None)  # restarts
            return
        q = window.end_step(level, feedback.residual)
        if q is not None:
            self.uplink.observe_sent_window(level, q)

    def observe_progress(self, level: int | None, spec: str) -> None:
        """The q of the level just sent, from error feedback's sums (lossy levels only)."""
        codec = _kind(spec)
        if self.feedback is not None and not codec.lossless:
            self.uplink.observe_progress(level, self.feedback.pop_progress(unbiased=codec.unbiased))


@functools.lru_cache(maxsize=64)
def _kind(spec: str) -> Codec:
    """A codec of `spec` whose kind alone is read (lossless, unbiased): never used to encode."""
    return make_codec(spec)


def sent_window_for(total_numel: int, uplink: UplinkController) -> SentWindow | None:
    """The sent level's window for `uplink`'s policy (None: it reads none), over keys of
    `total_numel` elements in all, in Adam's metric where the uplink's windows take it."""
    steps = uplink.policy.sent_window_steps
    if steps < 2:
        return None
    return SentWindow(steps, total_numel=total_numel, precondition=uplink.loop.precondition)


def bucketize(payloads: dict[str, Payload], bucket_bytes: int) -> list[dict[str, Payload]]:
    """Group small keys into messages of about `bucket_bytes` (one stream each); large keys alone."""
    out: list[dict[str, Payload]] = []
    current: dict[str, Payload] = {}
    size = 0
    for key, p in payloads.items():
        if current and size + p.wire_size > bucket_bytes:
            out.append(current)
            current, size = {}, 0
        current[key] = p
        size += p.wire_size
    if current:
        out.append(current)
    return out

"""Error feedback: what a lossy codec did not send is kept and added to the next gradient.

Without it, biased compressors (top-k, low-rank) stall training; with it, every coordinate's
mass arrives eventually (Karimireddy et al., 2019). Optional momentum correction follows Deep
Gradient Compression (Lin et al., 2018): momentum accumulates locally before compression, and
both the momentum and the residual are cleared on coordinates that were sent, so stale momentum
does not keep pushing coordinates that were already applied. With it the sender's optimizer is
plain SGD on the decoded tensor: the momentum lives here.

A residual lives for the whole run, so one bad value in it would poison every later step: the
residual is never stored non-finite, a non-finite gradient is refused before it touches any
state, a failing codec call leaves the state exactly as it was, and codecs that cannot keep the
residual bounded are refused (docs/RELIABILITY.md, "Error feedback safety").
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from netsense.errors import CompressionError, ConfigError

from .base import Codec, Payload
from .limits import cast_clamped
from .progress import progress_from_error


class NonFiniteGradient(CompressionError):
    """A gradient (or gradient + residual) holds NaN or inf: the caller logs it and skips the key
    for this step; the residual and momentum are as they were before the call."""

    def __init__(self, key: Hashable, message: str) -> None:
        super().__init__(message)
        self.key = key
        """The key whose gradient was refused."""


def require_feedback_safe(codec: Codec) -> None:
    """Raise `ConfigError` unless error feedback can run around `codec`.

    Refused rather than made safe: a codec without contraction (qsgd:1: every element goes out as
    +-its bucket's max) leaves a residual that error feedback adds back in full, so the residual
    grows without bound (measured: 988x the gradient's norm at step 10, inf by step 100). Scaling
    its input down by the variance bound 1 / (1 + 512) would contract, but it would send ~0.2% of
    the gradient per step: nothing would train either. Callers that build codecs for error
    feedback check here when the codec is made; `ErrorFeedback.compress` checks again."""
    if not codec.feedback_safe:
        raise ConfigError(
            f"codec {codec.spec!r} cannot run under error feedback: it does not contract (what it leaves "
            "out can exceed what it was given), so the residual grows without bound; use qsgd:2 or wider"
        )


def _energy(t: torch.Tensor) -> float:
    """||t||^2 of an fp32 tensor, NaN when an element is NaN or infinite: one fp32 dot (a cheap
    read-only pass, which NaN and inf always reach), summed again in float64 only when it overflowed."""
    flat = t.reshape(-1)
    energy = float(torch.dot(flat, flat))
    if math.isfinite(energy):
        return energy
    if not bool(torch.isfinite(flat).all()):
        return math.nan
    return float(flat.double().square().sum())


class ErrorFeedback:
    """Per-key residual memory (fp32, on the gradient's device) wrapped around any codec.

    Each key with a residual also keeps a spare buffer of its size: grad + residual is written
    into it, so the residual stays intact until the codec has succeeded (a fresh 44 MB buffer per
    step costs ~3x an add into a touched one on CPU, page faults), at the price of one more copy
    of the residual in memory."""

    def __init__(self, *, momentum: float = 0.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        """DGC momentum factor; 0 disables momentum correction."""
        self.clamped = 0
        """Values sent clamped to a 16-bit type's finite range (by the codecs or by the cast to a
        16-bit gradient dtype) since this object was made; the residual holds what was cut off."""
        self._residual: dict[Hashable, torch.Tensor] = {}
        self._spare: dict[Hashable, torch.Tensor] = {}
        self._velocity: dict[Hashable, torch.Tensor] = {}
        self._energy = 0.0  # sum of ||g + r||^2 over lossy compress() calls since pop_progress()
        self._error = 0.0  # sum of ||(g + r) - C(g + r)||^2, the mass left for later

    def compress(self, key: Hashable, grad: torch.Tensor, codec: Codec) -> tuple[Payload, torch.Tensor]:
        """Encode grad (+ momentum) + residual of `key`; returns the payload and its decoded tensor.

        The decoded tensor is what the receiver will apply, in `grad`'s dtype and device. Raises
        `NonFiniteGradient` for a gradient with NaN or inf, `ConfigError` for a codec that error
        feedback cannot run around, and whatever the codec raises; in every case the state of
        `key` (residual, momentum) and the progress sums are exactly as before the call.
        """
        require_feedback_safe(codec)
        update = grad.detach().float()
        velocity = None
        if self.momentum:
            old = self._velocity.get(key)
            # Out of place: the old velocity stays as it was until the codec has succeeded.
            fresh = old is None or old.shape != update.shape
            update = velocity = update.clone() if fresh else old.mul(self.momentum).add_(update)
        residual = self._residual.get(key)
        if residual is not None and residual.shape == update.shape:
            spare = self._spare.get(key)
            if spare is None or spare.shape != residual.shape:
                spare = torch.empty_like(residual)
            total = torch.add(residual, update, out=spare)
            owned = True
        else:
            total, owned = update, False  # may alias the caller's gradient: never mutated
        energy = _energy(total)
        if not math.isfinite(energy):
            raise NonFiniteGradient(key, self._non_finite(key, update))
        wire, cut = cast_clamped(total, grad.dtype)
        clamped_before = codec.clamped
        payload = codec.encode(wire)
        if codec.lossless:
            # Nothing is lost: an earlier lossy level's residual is flushed and none is kept (but
            # what the cast to a 16-bit gradient dtype clamped off, if anything).
            self._commit(key, total - wire.float() if cut else None, None, velocity)
            self.clamped += cut + codec.clamped - clamped_before
            if self.momentum:
                self._velocity[key] = torch.zeros_like(update)  # `wire` may alias `velocity`
            return payload, wire
        decoded = codec.decode(payload, device=grad.device)
        sent = decoded.float()
        left = total.sub_(sent) if owned else total - sent
        error = _energy(left)
        if not math.isfinite(error):
            raise CompressionError(f"{codec.spec}: decoded {key!r} to NaN or inf; the residual is kept as it was")
        self._commit(key, left, residual if owned else None, velocity)
        self._energy += energy
        self._error += error
        self.clamped += cut + codec.clamped - clamped_before
        if self.momentum:
            # DGC momentum factor masking: sent coordinates restart their momentum.
            self._velocity[key].masked_fill_(sent != 0, 0.0)
        return payload, decoded

    def _commit(self, key: Hashable, residual: torch.Tensor | None, spare: torch.Tensor | None,
                velocity: torch.Tensor | None) -> None:
        """Store the new state of `key` after a successful codec call (the old residual becomes
        the spare buffer of the next call)."""
        if residual is None:
            self._residual.pop(key, None)
        else:
            self._residual[key] = residual
        if spare is None:
            self._spare.pop(key, None)
        else:
            self._spare[key] = spare
        if velocity is not None:
            self._velocity[key] = velocity

    @staticmethod
    def _non_finite(key: Hashable, update: torch.Tensor) -> str:
        if bool(torch.isfinite(update).all()):
            return f"gradient of {key!r} plus its residual overflows fp32: skipped, residual kept"
        return f"gradient of {key!r} has NaN or infinite values: skipped, residual kept"

    def pop_progress(self, *, unbiased: bool = False) -> float | None:
        """Progress efficiency q of the lossy compressions since the last call, all keys together
        (1 - error / energy, or 1 / (1 + error / energy) for an unbiased codec; see
        `netsense.compression.progress`), and reset the sums; None when nothing lossy was sent."""
        q = progress_from_error(self._energy, self._error, unbiased=unbiased)
        self._energy = self._error = 0.0
        return q

    def residual(self, key: Hashable) -> torch.Tensor | None:
        """The residual kept for `key` (fp32), or None."""
        return self._residual.get(key)

    def reset(self, key: Hashable | None = None) -> None:
        """Drop the residual and momentum of `key`, or of every key when None."""
        if key is None:
            self._residual.clear()
            self._spare.clear()
            self._velocity.clear()
        else:
            self._residual.pop(key, None)
            self._spare.pop(key, None)
            self._velocity.pop(key, None)

    def residual_norm(self) -> float:
        """L2 norm of all residuals together: how much mass is waiting to be sent."""
        return math.sqrt(sum(float(r.square().sum()) for r in self._residual.values()))

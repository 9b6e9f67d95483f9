"""Error feedback: what a lossy codec did not send is kept and added to the next gradient.

Without it, biased compressors (top-k, low-rank) stall training; with it, every coordinate's
mass arrives eventually (Karimireddy et al., 2019). Optional momentum correction follows Deep
Gradient Compression (Lin et al., 2018): momentum accumulates locally before compression, and
both the momentum and the residual are cleared on coordinates that were sent, so stale momentum
does not keep pushing coordinates that were already applied. With it the sender's optimizer is
plain SGD on the decoded tensor: the momentum lives here.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from .base import Codec, Payload
from .progress import progress_from_error


class ErrorFeedback:
    """Per-key residual memory (fp32, on the gradient's device) wrapped around any codec."""

    def __init__(self, *, momentum: float = 0.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        """DGC momentum factor; 0 disables momentum correction."""
        self._residual: dict[Hashable, torch.Tensor] = {}
        self._velocity: dict[Hashable, torch.Tensor] = {}
        self._energy = 0.0  # sum of ||g + r||^2 over lossy compress() calls since pop_progress()
        self._error = 0.0  # sum of ||(g + r) - C(g + r)||^2, the mass left for later

    def compress(self, key: Hashable, grad: torch.Tensor, codec: Codec) -> tuple[Payload, torch.Tensor]:
        """Encode grad (+ momentum) + residual of `key`; returns the payload and its decoded tensor.

        The decoded tensor is what the receiver will apply, in `grad`'s dtype and device.
        """
        update = grad.detach().float()
        if self.momentum:
            velocity = self._velocity.get(key)
            if velocity is not None and velocity.shape == update.shape:
                update = velocity.mul_(self.momentum).add_(update)
            else:
                update = update.clone()
            self._velocity[key] = update
        residual = self._residual.pop(key, None)
        owned = residual is not None and residual.shape == update.shape
        # `update` may alias the caller's gradient or the velocity: only an owned total is mutated.
        total = residual.add_(update) if owned else update
        payload = codec.encode(total.to(grad.dtype))
        if codec.lossless:
            # Nothing is lost: an earlier lossy level's residual is flushed and none is kept.
            decoded = total.to(grad.dtype)
            if self.momentum:
                self._velocity[key] = torch.zeros_like(update)  # `decoded` may alias the old one
            return payload, decoded
        decoded = codec.decode(payload, device=grad.device)
        sent = decoded.float()
        energy = float(torch.dot(total.reshape(-1), total.reshape(-1)))
        residual = self._residual[key] = total.sub_(sent) if owned else total - sent
        self._energy += energy
        self._error += float(torch.dot(residual.reshape(-1), residual.reshape(-1)))
        if self.momentum:
            # DGC momentum factor masking: sent coordinates restart their momentum.
            self._velocity[key].masked_fill_(sent != 0, 0.0)
        return payload, decoded

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
            self._velocity.clear()
        else:
            self._residual.pop(key, None)
            self._velocity.pop(key, None)

    def residual_norm(self) -> float:
        """L2 norm of all residuals together: how much mass is waiting to be sent."""
        return math.sqrt(sum(float(r.square().sum()) for r in self._residual.values()))

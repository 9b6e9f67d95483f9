"""`GradientDownlink`: the downlink in the gradient domain (docs/ARCHITECTURE.md, "Gradient-domain
downlink").

In the parameter domain (encode.py) the PS steps its optimizer on the exact aggregated gradient and
sends the compressed change of the parameters, so a lossy downlink compresses a second time what
the uplink already compressed, and the momentum-filtered change is of higher rank than a gradient
(digits-cnn needed 100-125 steps at powersgd:2 where DDP's hook, which compresses once, needs
85-90: docs/BENCHMARKS.md). Here the PS compresses the step's aggregated gradient under error
feedback (m = g + e; sent C(m); e = m - C(m)) and steps its optimizer on what it sent, C(m); every
worker runs the same optimizer on the same C(m), so every replica still equals the PS's parameters
bit for bit, as DDP's ranks each apply the same all-reduced sum.

Each key goes at the codec of its smallest push (ties: the first contributing worker's, in id
order): the uplink's policies already picked the levels for this step's links, and the update goes
to every worker, the slowest path's too. Lossless specs send
the gradient whole, with what was owed (the residual is flushed). A key pushed sparse (top-k,
random-k, threshold) goes down exact too, the aggregate's nonzeros at fp32 (`EXACT_SPARSE`) or
dense fp32 where that is smaller: the sum of sparse pushes is sparse already, as a sparse
all-gather returns it, and a second sparsification under error feedback lagged (digits-cnn at
top-k 1 %: 0.88 test accuracy at step 200 against 0.95; random-k 25 %: 0.27 at step 100 against
0.45). Exact only while that stays the size of a sparse all-gather (`_sparse_exact`): a mean with
more nonzeros than the pushes' count times the codec's (a worker pushed a dense level this step)
goes at the sparse codec under error feedback, and what an earlier lossy step left owed goes
with the exact mean only where an entry is as large as the mean's count-th largest (at most the
codec's count of them a step). Until 2026-12-06 both went whole at fp32: a 640k-parameter
embedding model's update was 2.6 MB on every step where one worker pushed top-k 1 % and the
other PowerSGD, and on the first top-k step after a lossy one (docs/ARCHITECTURE.md,
"Gradient-domain downlink"). Residuals change only when the step commits (`commit`), so a
refused step leaves none behind.
"""

from __future__ import annotations

import numpy as np
import torch

from netsense.compression import Payload, make_codec
from netsense.compression.keycodecs import KeyCodecs
from netsense.compression.sparse import SparseCodec
from netsense.compression.topkscan import largest_indices
from netsense.transport.wire import Sum

LOSSLESS = ("fp32", "none")
"""Downlink specs sent as fp32, whole: a gradient with nothing left over, or in the parameter
domain the parameters themselves rather than a delta (`encode.py`)."""

EXACT_SPARSE = "threshold:1e-45"
"""Every entry at or above the least fp32 subnormal, at fp32: a tensor's nonzeros, exactly (a CPU
that flushes subnormals to zero compares with 0 and sends every entry, still exact)."""


class GradientDownlink:
    """Per-key error-feedback residuals and encoders of the gradient-domain downlink."""

    def __init__(self) -> None:
        self.residual: dict[str, torch.Tensor] = {}
        """Key -> what the downlink has not sent yet of the aggregated gradients (e)."""
        self._codecs = KeyCodecs()  # (key, spec) -> encoder (PowerSGD keeps its Q, and hands it on)
        self._fp32 = make_codec("fp32")
        self._nonzeros = make_codec(EXACT_SPARSE)
        self._rng = np.random.default_rng()  # the top-k scan's sample: steers only its speed
        self._pending: dict[str, tuple[Payload | Sum, torch.Tensor | None]] = {}  # key -> (what goes, new residual)
        self._version = -1  # the step the pending payloads belong to
        self._intents: tuple[tuple[str, str], ...] = ()  # the pending step's (worker, intent)
        self.intents: tuple[tuple[str, str], ...] = ()
        """The last committed step's (worker, `Push.intent`) of every contributor, in the PS's worker
        order; empty where one said none (`Params.intents`)."""

    def compress(self, version: int, key: str, grad: torch.Tensor, spec: str, pushes: int = 1) -> torch.Tensor:
        """C(grad + e) for the step from `version` (`grad`: the mean of `pushes` pushes of `key`):
        kept with its new residual until `commit`; returns what the optimizer steps on (a new float
        tensor of `grad`'s dtype)."""
        self._begin(version)
        old = self.residual.get(key)
        if old is not None and old.shape != grad.shape:
            old = None
        if spec in LOSSLESS:  # sent whole: what was owed goes with it
            m = grad + old if old is not None else grad.clone()
            self._pending[key] = (self._fp32.encode(m), None)
            return m
        if (key, spec) not in self._codecs and len(self._codecs) > 8 * max(1, len(self.residual) + 1):
            self._codecs.clear()  # bound: a job whose specs keep changing keeps no stale encoders
        codec = self._codecs.get(key, spec)
        if isinstance(codec, SparseCodec):
            exact = self._sparse_exact(key, grad, old, codec, pushes)
            if exact is not None:
                return exact
        m = grad + old if old is not None else grad.clone()
        payload = codec.encode(m)
        sent = codec.decode(payload).to(grad.dtype).view_as(grad)
        self._pending[key] = (payload, m.sub_(sent))
        return sent

    def note_intents(self, version: int, intents: tuple[tuple[str, str], ...]) -> None:
        """The step from `version`'s contributors' intents, (worker, spec): its update hands them on."""
        self._begin(version)
        self._intents = intents

    def forward(self, version: int, key: str, terms: list[tuple[str, float, Payload]]) -> None:
        """`key` of the step from `version` goes as its pushes, (worker, weight, payload) in the
        order the PS summed them (`Sum`): every worker rebuilds the exact mean, the PS's gradient.
        What an earlier compressed step left owed of the key stays owed, to go with the key's next
        compressed step (docs/ARCHITECTURE.md, "Forwarded pushes")."""
        self._begin(version)
        owners = tuple(w for w, _, _ in terms)
        self._pending[key] = (Sum(tuple(w for _, w, _ in terms), -1, tuple(p for _, _, p in terms), owners), self.residual.get(key))

    def _sparse_exact(
        self, key: str, grad: torch.Tensor, old: torch.Tensor | None, codec: SparseCodec, pushes: int
    ) -> torch.Tensor | None:
        """A sparse push's key sent exact, if its mean is as sparse as `pushes` sparse pushes can
        make it (None: not, the caller compresses it): the mean, and what was owed (all of it for a
        codec whose count follows the data, or if it has no more entries than the codec's count;
        else the entries as large as the mean's count-th largest, the codec's count of them at
        most: an entry owed goes when the codec would have picked it from the mean); the rest
        stays owed. (The mean's least nonzero drained the count every step: two pushes' values
        nearly cancel.)"""
        numel = grad.numel()
        count = codec.count_bounds(numel)[1]
        if int(torch.count_nonzero(grad)) > max(1, pushes) * count:
            return None
        residual = None
        if old is None:
            sent = grad.clone()
        elif count >= numel or int(torch.count_nonzero(old)) <= count:
            sent = grad + old
        else:
            sent, residual = self._drain(grad, old, count)
        self._pending[key] = (self._exact(sent), residual)
        return sent

    def _drain(self, grad: torch.Tensor, old: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`grad` plus the entries of `old` as large as its count-th largest magnitude (at most
        `count` of them: the largest `count` of `old`, those of them that large), and what stays
        owed. On the PS's step path every step while anything is owed, so the usual case, nothing
        that large, costs one pass over `old` (its magnitudes' max) and leaves it uncopied
        (whole-tensor masks and torch's top-k took 8.5 ms a step on a 640k key)."""
        sums = grad.reshape(-1).abs()
        sums = sums[sums > 0]  # at most pushes x count entries
        least = float(sums.topk(min(count, sums.numel())).values[-1]) if sums.numel() else 0.0
        flat = old.reshape(-1)
        due = flat.abs()
        if float(due.max()) < least:
            return grad.clone(), old  # the stored residual is never written to: kept as it is
        idx = largest_indices(flat, count, self._rng)
        idx = idx[due[idx] >= least] if least > 0 else idx[due[idx] > 0]
        sent = grad.clone()
        sent.view(-1)[idx] += flat[idx]
        residual = old.clone()
        residual.view(-1)[idx] = 0
        return sent, residual

    def _exact(self, m: torch.Tensor) -> Payload:
        """`m` without loss: its nonzeros and their indices, or dense fp32 where that is smaller."""
        if 2 * int(torch.count_nonzero(m)) < m.numel():
            payload = self._nonzeros.encode(m)
            if sum(len(p) for p in payload.parts) < 4 * m.numel():
                return payload
        return self._fp32.encode(m)

    def _begin(self, version: int) -> None:
        """What is pending belongs to the step from `version`: a different step's is forgotten."""
        if version != self._version:
            self.discard()
            self._version = version

    def commit(self, version: int) -> dict[str, Payload | Sum]:
        """The step from `version` applied: its residuals replace the old ones; what goes of each
        key (compressed or forwarded for it, in order)."""
        if version != self._version:
            self.discard()
            self.intents = ()
            return {}
        self.intents = self._intents
        out = {}
        for key, (payload, residual) in self._pending.items():
            out[key] = payload
            if residual is None:
                self.residual.pop(key, None)
            else:
                self.residual[key] = residual
        self._pending = {}
        self._version = -1
        self._intents = ()
        return out

    def payload(self, key: str) -> Payload | Sum:
        """What goes of `key` in the pending step (a key applied ahead, pipeline.py)."""
        return self._pending[key][0]

    def discard(self) -> None:
        """A step refused or abandoned: what it compressed is forgotten, residuals as they were."""
        self._pending = {}
        self._version = -1
        self._intents = ()

    def reset(self) -> None:
        """A fresh start or a restore: nothing owed."""
        self.discard()
        self.residual.clear()
        self._codecs.clear()

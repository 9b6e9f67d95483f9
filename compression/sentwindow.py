"""`SentWindow`: q_W of the level being sent, read off the run's own error feedback (docs/POLICIES.md,
"The sent level's window").

A progress window (window.py) prices a level by running its codec beside the real sends, at a CPU
cost that keeps windows rare (`progress_budget`), and the first of them sees a fresh model's
gradients, of low rank: on a patch-attention model (not in the repo, Adam) the first window priced
powersgd:1 at 0.92 where the run's steps put it at 0.52, no later window ran it for 160 steps,
and netsense sent it for 114 of them (docs/history/BENCHMARKS-2026.md, "The sent level's window"). The level
actually sent needs no second codec: over W consecutive steps at one level, what error feedback
sent less the gradients is sum_t (sent_t - g_t) = r_start - r_end = D, and r_end is the residual it
holds, so window.py's

    q_W = |sum g|^2 / (|sum g|^2 + |D|^2 + |r_end|^2)

comes from sums the sends already made, on the real stream in its real state (residuals as the run
left them, not from zero or a short fill), every W steps the level is held. In Adam's metric
(`precondition`) the energies are weighed as the windows weigh them (`adam_weight`: the window's
own mean g^2 and mean (sent - g)^2). A window restarts when the level changes, a key is encoded
twice in a step (a withdrawn push re-encoded) or a step's keys differ (a non-finite gradient sent
as zero). Sums run on a strided sample of each key when the model has more than `max_numel`
elements (energies only: no codec runs on the sample, so its error is the codec's on the whole key).
Sans I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import torch

from .window import adam_weight, energy, window_progress

SENT_SAMPLE_NUMEL = 1 << 16
"""Most elements the sums keep (a stride over every key beyond it): four such buffers in Adam's
metric, two otherwise, and a few element-wise passes over them a step (0.5 ms a step on wide-mlp's
337k elements whole, one core; the energies of 65k evenly spaced ones stand for them)."""


class SentWindow:
    """Sums of the sent level's steps; `end_step` returns that level's q_W each W steps at one level."""

    def __init__(self, window: int, *, total_numel: int, precondition: bool = False, max_numel: int = SENT_SAMPLE_NUMEL) -> None:
        if window < 2:
            raise ValueError(f"a sent-level window needs at least 2 steps, got {window}")
        self.window = window
        self.precondition = precondition
        self.stride = max(1, math.ceil(total_numel / max(1, max_numel)))
        """Every stride-th element of each key (flattened) goes into the sums."""
        self.windows = 0
        """Windows completed since the start."""
        self._level: int | None = None  # the level of the window under way
        self._steps = 0  # steps summed in it
        self._keys: tuple[Hashable, ...] | None = None  # the keys of its first step, in order
        self._sums: dict[Hashable, list[torch.Tensor]] = {}  # key -> [sum g, sum (sent - g), (sum g^2, sum (sent - g)^2)]
        self._step_keys: list[Hashable] = []  # the keys added in the step under way, in order
        self._step_seen: set[Hashable] = set()  # the same, for the membership test (models of thousands of keys)
        self._spoiled = False  # the step under way cannot count

    def add(self, key: Hashable, grad: torch.Tensor, sent: torch.Tensor) -> None:
        """One key of the step under way: its gradient before error feedback and what was sent
        for it (the decoded payload)."""
        if key in self._step_seen or grad.shape != sent.shape:
            self._spoiled = True
            return
        self._step_keys.append(key)
        self._step_seen.add(key)
        g = self._sample(grad)
        d = self._sample(sent) - g
        sums = self._sums.get(key)
        if sums is None or sums[0].shape != g.shape or self._steps == 0:
            sums = self._sums[key] = [torch.zeros_like(g) for _ in range(4 if self.precondition else 2)]
        sums[0].add_(g)
        sums[1].add_(d)
        if self.precondition:
            sums[2].addcmul_(g, g)
            sums[3].addcmul_(d, d)

    def spoil(self) -> None:
        """The step under way does not count (a key sent as zero, a re-encode): the window restarts."""
        self._spoiled = True

    def end_step(self, level: int | None, residual: Callable[[Hashable], torch.Tensor | None]) -> float | None:
        """The step's sends are done at ladder level `level` (None or a lossless level: no window);
        `residual(key)` is what error feedback holds for a key now. Returns q_W when this step
        completes a window of `level`, else None."""
        keys, spoiled = tuple(self._step_keys), self._spoiled
        self._step_keys, self._spoiled = [], False
        self._step_seen.clear()
        if spoiled or level is None or not keys:
            self._restart()
            return None
        if self._steps and (level != self._level or keys != self._keys):
            self._restart()
            return None  # this step's sums went into the old window's buffers: start at the next
        if not self._steps:
            self._level, self._keys = level, keys
        self._steps += 1
        if self._steps < self.window:
            return None
        q = self._progress(keys, residual)
        self._restart()
        if q is not None:
            self.windows += 1
        return q

    def _progress(self, keys: tuple[Hashable, ...], residual: Callable[[Hashable], torch.Tensor | None]) -> float | None:
        signal = error = 0.0
        steps = self._steps
        for key in keys:
            sums = self._sums[key]
            r = residual(key)
            r_end = self._sample(r) if r is not None else torch.zeros_like(sums[0])
            if r_end.shape != sums[0].shape:
                return None
            w = adam_weight(sums[2] / steps, sums[3] / steps) if self.precondition else None
            signal += energy(sums[0], w)
            error += energy(sums[1], w) + energy(r_end, w)
        return window_progress(signal, error)

    def _sample(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.detach().reshape(-1)
        return (flat[:: self.stride] if self.stride > 1 else flat).float()

    def _restart(self) -> None:
        self._level, self._keys, self._steps = None, None, 0

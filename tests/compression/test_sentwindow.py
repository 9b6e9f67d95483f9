"""The sent level's window: q_W from the sends' own error feedback, on streams whose answer is known."""

from __future__ import annotations

import pytest
import torch

from netsense.compression.sentwindow import SentWindow
from netsense.compression.window import adam_weight, energy

W = 8


def _masked_run(window: SentWindow, steps: int, level: int = 4, *, seed: int = 0, start: torch.Tensor | None = None):
    """Error feedback around a codec that sends only the first half of the coordinates: returns
    (the q_W figures `end_step` gave, sum g, r_start, r_end, sum g^2, sum (sent - g)^2 of the last W steps)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(64)
    mask[:32] = 1
    r = start.clone() if start is not None else torch.zeros(64)
    figures, hist = [], []
    for _ in range(steps):
        g = torch.randn(64, generator=gen) + 0.5
        v = g + r
        sent = v * mask
        r_before, r = r, v - sent
        window.add("w", g, sent)
        figures.append(window.end_step(level, lambda key: r))
        hist.append((g, sent, r_before, r))
    last = hist[-W:]
    sum_g = sum(g for g, _, _, _ in last)
    sq_g = sum(g * g for g, _, _, _ in last)
    sq_d = sum((s - g) ** 2 for g, s, _, _ in last)
    return figures, sum_g, last[0][2], last[-1][3], sq_g, sq_d


def test_a_withheld_half_is_priced_by_what_stays_out_exactly() -> None:
    window = SentWindow(W, total_numel=64)
    figures, sum_g, r_start, r_end, _, _ = _masked_run(window, W)
    assert figures[:-1] == [None] * (W - 1)
    expected = energy(sum_g) / (energy(sum_g) + energy(r_start - r_end) + energy(r_end))
    assert figures[-1] == pytest.approx(expected, rel=1e-5)
    assert r_start.abs().sum() == 0 and figures[-1] < 0.6  # half the mass out twice: D and the lag


def test_a_later_window_starts_from_the_residual_the_run_left() -> None:
    window = SentWindow(W, total_numel=64)
    figures, sum_g, r_start, r_end, _, _ = _masked_run(window, 3 * W)
    got = [q for q in figures if q is not None]
    assert len(got) == 3 and window.windows == 3
    assert r_start.abs().sum() > 0  # the third window's start: the residual after 2 W steps
    expected = energy(sum_g) / (energy(sum_g) + energy(r_start - r_end) + energy(r_end))
    assert got[-1] == pytest.approx(expected, rel=1e-5)


def test_adam_metric_weighs_each_coordinate_by_its_moments() -> None:
    window = SentWindow(W, total_numel=64, precondition=True)
    figures, sum_g, r_start, r_end, sq_g, sq_d = _masked_run(window, W)
    w = adam_weight(sq_g / W, sq_d / W)
    expected = energy(sum_g, w) / (energy(sum_g, w) + energy(r_start - r_end, w) + energy(r_end, w))
    assert figures[-1] == pytest.approx(expected, rel=1e-5)
    raw = energy(sum_g) / (energy(sum_g) + energy(r_start - r_end) + energy(r_end))
    assert abs(figures[-1] - raw) > 1e-3  # the metric matters on this stream


def test_a_lossless_codec_is_priced_one() -> None:
    window = SentWindow(W, total_numel=16)
    q = None
    for step in range(W):
        g = torch.full((16,), float(step + 1))
        window.add("k", g, g.clone())
        q = window.end_step(2, lambda key: torch.zeros(16))
    assert q == pytest.approx(1.0)


def test_a_level_change_a_lossless_step_and_a_re_encode_restart_the_window() -> None:
    window = SentWindow(W, total_numel=4)
    zero = torch.zeros(4)

    def step(level: int | None, keys: tuple[str, ...] = ("a",)) -> float | None:
        for key in keys:
            window.add(key, torch.ones(4), torch.ones(4))
        return window.end_step(level, lambda key: zero)

    assert [step(4) for _ in range(W - 1)] == [None] * (W - 1)
    assert step(5) is None  # another level: the W - 1 steps at 4 count for nothing
    assert [step(5) for _ in range(W - 1)] == [None] * (W - 1)  # the change step itself is not counted
    assert step(5) is not None
    assert [step(5) for _ in range(W - 2)] == [None] * (W - 2)
    assert step(None) is None  # a lossless send flushes the residual: restart
    assert [step(5) for _ in range(W - 1)] == [None] * (W - 1)
    assert step(5, ("a", "a")) is None  # a key encoded twice (a withdrawn push re-encoded)
    assert [step(5) for _ in range(W - 1)] == [None] * (W - 1)
    window.spoil()  # a key sent as zero for a non-finite gradient
    assert step(5) is None
    assert [step(5) for _ in range(W - 1)] == [None] * (W - 1)
    assert step(5, ("a", "b")) is None  # a step of other keys than the window's
    assert window.windows == 1


def test_a_large_model_is_summed_on_a_strided_sample() -> None:
    window = SentWindow(W, total_numel=1000, max_numel=100)
    assert window.stride == 10
    full = SentWindow(W, total_numel=100)
    gen = torch.Generator().manual_seed(1)
    r = torch.zeros(1000)
    mask = (torch.arange(1000) % 3 == 0).float()
    for _ in range(W):
        g = torch.randn(1000, generator=gen)
        v = g + r
        sent, r = v * mask, v - v * mask
        q = window.end_step(1, lambda key: r) if window.add("k", g, sent) is None else None
        q_full = full.end_step(1, lambda key: r[::10]) if full.add("k", g[::10], sent[::10]) is None else None
    assert q is not None and q == pytest.approx(q_full, rel=1e-6)
    with pytest.raises(ValueError):
        SentWindow(1, total_numel=4)

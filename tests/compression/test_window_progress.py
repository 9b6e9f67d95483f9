"""Windowed progress (compression/window.py) on synthetic gradient streams whose answer is known."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from netsense.compression import Codec, Payload, register_codec
from netsense.compression.progress import measure_progress
from netsense.compression.window import NoiseScale, WindowProbe, noise_scale, projected_progress, signal_growth, window_progress
from netsense.errors import CompressionError

D = 4096  # elements per stream: below the probe's sample size, so it sees every one


class _Fake(Codec):
    """Decodes what it was last given, transformed: a codec whose error is known exactly."""

    lossless = False

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._last: torch.Tensor | None = None

    def encode(self, tensor: torch.Tensor) -> Payload:
        self._last = tensor.detach().clone()
        return Payload(self.spec, tuple(tensor.shape), "float32", (b"",))

    def decode(self, payload: Payload, *, device: torch.device | str = "cpu") -> torch.Tensor:
        assert self._last is not None
        return self.transform(self._last)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class DropHalf(_Fake):
    """Never sends the second half of the coordinates: its residual there grows step after step."""

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        out.reshape(-1)[x.numel() // 2 :] = 0
        return out


class AddNoise(_Fake):
    """Unbiased: adds fresh Gaussian noise, NOISE_ENERGY per step over all keys (shared by size)."""

    gen = torch.Generator().manual_seed(7)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(x.shape, generator=self.gen) * math.sqrt(NOISE_ENERGY / D)


class SendHalf(_Fake):
    """Sends half of what it is given: under error feedback on a constant gradient its residual
    settles at one gradient, so everything is delivered, one step late."""

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x


class FailOnThird(_Fake):
    """Sends what it is given until its third call, which fails as a codec does on bad input."""

    calls = 0

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise CompressionError("winfakefail: third call")
        return x.clone()


NOISE_ENERGY = 50.0
register_codec("winfakefail", lambda arg: FailOnThird("winfakefail"))
register_codec("winfakehalf", lambda arg: SendHalf("winfakehalf"))
register_codec("winfakedrop", lambda arg: DropHalf("winfakedrop"))
register_codec("winfakenoise", lambda arg: AddNoise("winfakenoise"))


def stream(gen: torch.Generator, *, g2: float, tr: float):
    """Gradients g = G + noise with |G|^2 = g2 and tr(Sigma) = tr, as one 1-D key and one matrix key."""
    g = torch.randn(D, generator=gen)
    g *= math.sqrt(g2) / g.norm()
    while True:
        x = g + torch.randn(D, generator=gen) * math.sqrt(tr / D)
        yield [x[: D // 2], x[D // 2 :].reshape(32, -1)]


def run_windows(specs: dict[int, str], *, window: int, windows: int, g2: float, tr: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    grads = stream(gen, g2=g2, tr=tr)
    results = []
    for _ in range(windows):
        probe = WindowProbe(specs, window=window)
        result = None
        while result is None or result.interim:
            result = probe.feed(next(grads))
        results.append(result)
    return results


def test_noise_scale_is_exact_on_two_known_steps() -> None:
    # g1 = (1, 1), g2 = (1, -1): cross product 0 -> |G|^2 0; mean |g|^2 = 2 -> noise 2.
    ns = noise_scale(sum_energy=4.0, energy_sum=4.0, steps=2)
    assert ns.signal == 0 and ns.noise == 2 and ns.ratio == math.inf
    with pytest.raises(ValueError):
        noise_scale(1.0, 1.0, 1)


@pytest.mark.parametrize(("g2", "tr"), [(1.0, 20.0), (4.0, 1.0)])
def test_noise_scale_estimate_converges_to_the_stream(g2: float, tr: float) -> None:
    results = run_windows({}, window=8, windows=40, g2=g2, tr=tr)
    signal = sum(r.noise.signal for r in results) / len(results)
    noise = sum(r.noise.noise for r in results) / len(results)
    assert signal == pytest.approx(g2, rel=0.25)
    assert noise == pytest.approx(tr, rel=0.1)
    assert noise / signal == pytest.approx(tr / g2, rel=0.35)


def test_window_progress_formula() -> None:
    assert window_progress(3.0, 1.0) == 0.75
    assert window_progress(0.0, 1.0) is None
    assert window_progress(2.0, -1.0) == 1.0


@pytest.mark.parametrize("warm", [4, 0])
def test_a_codec_that_withholds_coordinates_is_priced_by_what_stays_out(warm: int) -> None:
    # The window's update misses sum(g) on the dropped half exactly: q = |sum g|^2 / (|sum g|^2 + |sum g_half|^2).
    # warm=0 (the policy's first window, as the run's own residuals) measures from zero residuals: D = r_end.
    gen = torch.Generator().manual_seed(3)
    grads = [[torch.randn(D, generator=gen) + 1.0] for _ in range(warm + 4)]
    probe = WindowProbe({3: "winfakedrop"}, window=4, warm=warm)
    result = None
    for g in grads:
        result = probe.feed(g)
    assert result is not None and probe.done and not result.interim
    total = sum(g[0] for g in grads[warm:])
    half = total[D // 2 :]
    # ... plus the lag left at the window's end: the half's whole sum since the residuals started.
    lag = sum(g[0] for g in grads)[D // 2 :]
    expected = float(total.square().sum()) / float(total.square().sum() + half.square().sum() + lag.square().sum())
    assert result.progress[3] == pytest.approx(expected, rel=1e-5)


def test_a_settled_residual_is_priced_by_the_lag_it_leaves() -> None:
    # r_t = (g + r_{t-1}) / 2 settles at g: once settled, D = r_start - r_end ~ 0, and the window
    # used to price the level at 1; it ends one gradient behind: q = |W g|^2 / (|W g|^2 + |g|^2).
    g = torch.randn(D, generator=torch.Generator().manual_seed(4))
    probe = WindowProbe({1: "winfakehalf"}, window=8, warm=16, interim=0)
    result = None
    while result is None:
        result = probe.feed([g.clone()])
    assert result.progress[1] == pytest.approx(64 / 65, rel=1e-4)


def _parameters(steps: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The running totals of `steps` from zero, the base first: a PS's parameters."""
    params, out = torch.zeros_like(steps[0]), [[torch.zeros_like(steps[0])]]
    for s in steps:
        params = params + s
        out.append([params.clone()])
    return out


def test_a_parameter_streams_settled_residual_is_charged_at_every_step() -> None:
    # The downlink's residual is how far the replicas trail, at every step it stays: settled at one
    # update u, a window of 8 charges 8 |u|^2 against |8 u|^2 (q = 64 / 72), where a gradient
    # stream's window charges it once (64 / 65, the test above).
    u = torch.randn(D, generator=torch.Generator().manual_seed(4))
    probe = WindowProbe({1: "winfakehalf"}, window=8, warm=16, interim=0, cumulative=True)
    result = None
    for params in _parameters([u] * 24):  # the base, 16 to fill, 8 measured
        result = probe.feed(params)
    assert result is not None and probe.done
    assert result.progress[1] == pytest.approx(64 / 72, rel=1e-4)


def test_a_parameter_stream_is_charged_each_steps_lag_exactly() -> None:
    # From zero residuals (warm 0) a codec that never sends half the coordinates trails by the
    # half's running sum r_t: q = |sum u|^2 / (|sum u|^2 + |r_end|^2 + sum_t |r_t|^2), D = r_end.
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(D, generator=gen) + 1.0 for _ in range(4)]
    probe = WindowProbe({3: "winfakedrop"}, window=4, warm=0, interim=0, cumulative=True)
    result = None
    for params in _parameters(steps):
        result = probe.feed(params)
    assert result is not None
    total = sum(steps)
    lags = [sum(steps[: t + 1])[D // 2 :] for t in range(4)]
    signal = float(total.square().sum())
    expected = signal / (signal + float(lags[-1].square().sum()) + sum(float(r.square().sum()) for r in lags))
    assert result.progress[3] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="Adam"):
        WindowProbe({3: "winfakedrop"}, window=4, cumulative=True, precondition=True)


def test_a_parameter_streams_lag_is_charged_as_lag_energy_says() -> None:
    # `lag_energy` replaces each measured step's |r_t|^2 (scripts/window_sweep.py --curvature
    # weighs it by the loss's curvature): given each step's residual, what it returns is charged.
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(D, generator=gen) + 1.0 for _ in range(4)]
    seen: list[tuple[int, float]] = []

    def quarter(level: int, residual: Sequence[torch.Tensor]) -> float:
        seen.append((level, sum(float(r.square().sum()) for r in residual)))
        return seen[-1][1] / 4

    probe = WindowProbe({3: "winfakedrop"}, window=4, warm=0, interim=0, cumulative=True, lag_energy=quarter)
    result = None
    for params in _parameters(steps):
        result = probe.feed(params)
    assert result is not None
    lags = [sum(steps[: t + 1])[D // 2 :] for t in range(4)]
    assert [level for level, _ in seen] == [3] * 4
    assert [e for _, e in seen] == pytest.approx([float(r.square().sum()) for r in lags], rel=1e-5)
    signal = float(sum(steps).square().sum())
    expected = signal / (signal + float(lags[-1].square().sum()) + sum(float(r.square().sum()) for r in lags) / 4)
    assert result.progress[3] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="cumulative"):
        WindowProbe({3: "winfakedrop"}, window=4, lag_energy=quarter)


def test_an_unbiased_codec_gets_the_q_the_formula_gives() -> None:
    # Under error feedback an additive noise n_t is re-sent next step: the window misses n_start - n_end,
    # energy 2 * NOISE_ENERGY, and ends behind by n_end, NOISE_ENERGY more, against
    # E|sum g|^2 = W^2 |G|^2 + W tr.
    w, g2, tr = 8, 1.0, 16.0
    results = run_windows({1: "winfakenoise"}, window=w, windows=30, g2=g2, tr=tr)
    mean_q = sum(r.progress[1] for r in results) / len(results)
    sum_energy = w * w * g2 + w * tr
    expected = sum_energy / (sum_energy + 3 * NOISE_ENERGY)
    assert mean_q == pytest.approx(expected, abs=0.04)
    one_step = (g2 + tr) / (g2 + tr + NOISE_ENERGY)  # what one step's error/energy ratio gives
    assert mean_q > one_step + 0.2


def test_error_feedback_prices_a_biased_codec_above_its_one_step_error() -> None:
    gen = torch.Generator().manual_seed(1)
    grads = stream(gen, g2=4.0, tr=4.0)
    one_step = measure_progress(make("topk:0.1"), next(grads))
    results = run_windows({4: "topk:0.1"}, window=8, windows=6, g2=4.0, tr=4.0)
    windowed = min(r.progress[4] for r in results)
    assert one_step is not None and one_step < 0.5
    assert windowed > one_step + 0.2


def test_noise_dominated_streams_price_qsgd4_close_to_one() -> None:
    # Heavy-tailed noise (a few large coordinates) makes one step of qsgd:4 costly; over a window the
    # re-sent error is small beside the noise that SGD carries anyway.
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(D, generator=gen) * 0.01

    def heavy():
        while True:
            n = torch.randn(D, generator=gen) * (torch.rand(D, generator=gen) < 0.01) * 30
            yield [g + n + 0.1 * torch.randn(D, generator=gen)]

    grads = heavy()
    one_step = measure_progress(make("qsgd:4"), next(grads))
    probe = WindowProbe({2: "qsgd:4", 5: "topk:0.001+fp16"}, window=16)
    result = None
    while result is None or result.interim:
        result = probe.feed(next(grads))
    assert result.noise.ratio > 10
    # One step: omega ~1.4, q 0.42; the window misses two steps' errors against 16 steps of noise.
    assert one_step is not None and one_step < 0.5
    assert result.progress[2] > max(0.8, 1.8 * one_step)
    assert result.progress[5] < result.progress[2]


def test_cumulative_stream_is_differenced_and_bad_input_restarts() -> None:
    # The PS feeds parameters: the probe's gradients are their changes. Same stream both ways, same q.
    gen = torch.Generator().manual_seed(4)
    steps = [torch.randn(256, generator=gen) + 0.5 for _ in range(8)]
    direct, cumul = WindowProbe({1: "qsgd:4"}, window=4, warm=4), WindowProbe({1: "qsgd:4"}, window=4, warm=4, cumulative=True)
    params = torch.zeros(256)
    assert cumul.feed([params.clone()]) is None  # the base
    r1 = r2 = None
    for s in steps:
        params += s
        r1, r2 = direct.feed([s]), cumul.feed([params.clone()])
    assert r1 is not None and r2 is not None
    assert abs(r1.noise.signal - r2.noise.signal) < 1e-3 * abs(r1.noise.signal)
    probe = WindowProbe({1: "qsgd:4"}, window=2, warm=2)
    probe.feed([torch.ones(8)])
    probe.feed([torch.full((8,), math.nan)])  # a non-finite gradient: the window starts over
    assert probe.fed == 0
    probe.feed([torch.ones(8)])
    probe.feed([torch.ones(4)])  # the shapes changed: starts over with this step
    assert probe.fed == 1


def make(spec: str):
    from netsense.compression import make_codec

    return make_codec(spec)


def test_interim_results_come_after_a_quarter_and_a_half_of_the_measured_steps_and_price_lower() -> None:
    gen = torch.Generator().manual_seed(5)
    grads = stream(gen, g2=1.0, tr=16.0)
    probe = WindowProbe({1: "winfakenoise"}, window=16)
    results = []
    for step in range(24):
        r = probe.feed(next(grads))
        if r is not None:
            results.append((step, r))
    assert [(step, r.interim, r.steps) for step, r in results] == [(11, True, 4), (15, True, 8), (23, False, 16)]
    assert results[0][1].progress[1] < results[2][1].progress[1]  # fewer re-sends credited


def test_projected_progress_follows_a_power_law_of_the_odds_within_the_cap() -> None:
    def q(odds: float) -> float:
        return 1 / (1 + odds)

    exact = [(w, q(0.8 * w**-1.5)) for w in (2, 3, 4)]
    assert projected_progress(exact, 16, 2.0) == pytest.approx(q(0.8 * 16**-1.5), rel=1e-9)
    # odds cannot fall faster than the update's energy grows: held to the cap
    assert projected_progress(exact, 16, 1.0) == pytest.approx(q(0.8 * 4**-1.5 * 4**-1.0), rel=1e-9)
    rising = [(2, 0.8), (3, 0.75), (4, 0.7)]
    assert projected_progress(rising, 16, 2.0) == pytest.approx(0.7)  # never below the last figure
    assert projected_progress([(4, 0.7)], 16, 2.0) is None
    assert projected_progress([(2, 1.0), (3, 1.0), (4, 0.9)], 16, 2.0) is None  # one usable point
    assert projected_progress([(2, 0.5), (3, 0.6), (4, 0.0)], 16, 2.0) is None  # no figure at the last step
    assert projected_progress([(2, 0.5), (3, 0.6), (4, 1.0)], 16, 2.0) is None  # lossless by then


def test_signal_growth_is_two_for_a_true_gradient_and_one_for_noise() -> None:
    assert signal_growth(NoiseScale(signal=1.0, noise=0.0), 4, 16) == pytest.approx(2.0)
    assert signal_growth(NoiseScale(signal=0.0, noise=1.0), 4, 16) == 1.0
    assert signal_growth(NoiseScale(signal=-0.5, noise=1.0), 4, 16) == 1.0
    assert 1.0 < signal_growth(NoiseScale(signal=1.0, noise=8.0), 4, 16) < 2.0


def _first_window(spec: str, window: int, interim: int | None = None) -> list:
    """Results of a first window (no fill steps) on a constant gradient."""
    g = torch.randn(D, generator=torch.Generator().manual_seed(3))
    probe = WindowProbe({1: spec}, window=window, warm=0, interim=interim)
    results = [probe.feed([g[: D // 2], g[D // 2 :].reshape(32, -1)]) for _ in range(window)]
    return [r for r in results if r is not None]


def test_an_interim_figure_projects_a_settling_residual_towards_the_windows_figure() -> None:
    # SendHalf's residual settles at one gradient: q_w = w^2 / (w^2 + 2 |r_w|^2 / |g|^2) climbs with w
    interim, later, final = _first_window("winfakehalf", 16)
    (raw,) = _first_window("winfakehalf", 4, interim=0)  # what the interim said before projecting
    assert (interim.steps, later.steps) == (4, 8) and interim.interim and later.interim and not final.interim
    assert raw.progress[1] == pytest.approx(16 / (16 + 2 * (1 - 2**-4) ** 2), rel=1e-5)
    assert raw.progress[1] < interim.progress[1] <= final.progress[1] + 0.01
    assert final.progress[1] - interim.progress[1] < 0.2 * (final.progress[1] - raw.progress[1])
    assert abs(final.progress[1] - later.progress[1]) <= abs(final.progress[1] - interim.progress[1])


def test_an_interim_figure_does_not_flatter_a_residual_that_keeps_growing() -> None:
    # DropHalf never sends half the coordinates: its residual grows as the update does, q stays put
    interim, _, final = _first_window("winfakedrop", 16)
    assert interim.progress[1] == pytest.approx(final.progress[1], rel=1e-6)
    assert interim.progress[1] == pytest.approx(0.5, abs=0.01)


def test_low_rank_levels_see_whole_keys_and_are_not_flattered_by_a_row_subsample() -> None:
    # A rank-2 fit to 8 of 512 rows keeps far more of a noisy matrix than the fit to all 512 rows.
    gen = torch.Generator().manual_seed(6)
    signal = torch.randn(512, 512, generator=gen) * 0.1

    def q(probe: WindowProbe) -> float:
        result = None
        while result is None or result.interim:
            result = probe.feed([signal + torch.randn(512, 512, generator=gen)])
        return result.progress[2]

    whole = WindowProbe({1: "qsgd:4", 2: "powersgd:2"}, window=8, numel=1 << 12)
    q_whole = q(whole)
    assert whole._residual[2][0].shape == (512, 512) and whole._residual[1][0].numel() <= 1 << 12
    rows = WindowProbe({2: "powersgd:2"}, window=8, numel=1 << 12)
    rows._whole.clear()  # what the probe did before whole keys: the row subsample
    assert q(rows) > q_whole + 0.1
    assert abs(q(WindowProbe({2: "powersgd:2"}, window=8, numel=1 << 14)) - q_whole) < 0.03  # whole keys: the sample size does not matter


def test_a_window_step_runs_on_one_thread_and_restores_the_setting() -> None:
    seen: list[int] = []

    class Spy(_Fake):
        def transform(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return x

    register_codec("winfakespy", lambda arg: Spy("winfakespy"))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        WindowProbe({1: "winfakespy"}, window=4).feed([torch.ones(8)])
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("warm", [0, 4])
def test_preconditioned_a_codec_that_drops_the_small_coordinates_costs_what_adam_would_lose(warm: int) -> None:
    # Adam moves every coordinate by about its gradient over its own scale, so a codec that never
    # sends the small half loses half of what Adam applies, though it is ~1e-8 of the raw energy.
    # Weights 1 / (v + s): v the mean g^2 over every step fed, s the level's mean (sent - g)^2 over
    # the measured ones (g itself on the dropped half, 0 on the sent half); D the dropped half's sum.
    gen = torch.Generator().manual_seed(5)
    scale = torch.cat([torch.full((D // 2,), 100.0), torch.full((D // 2,), 0.01)])
    grads = [[(torch.randn(D, generator=gen) + 1.0) * scale] for _ in range(warm + 8)]
    raw, pre = WindowProbe({3: "winfakedrop"}, window=8, warm=warm), WindowProbe({3: "winfakedrop"}, window=8, warm=warm, precondition=True)
    for g in grads:
        got_raw, got_pre = raw.feed(g), pre.feed(g)
    assert got_raw is not None and got_pre is not None and not got_pre.interim
    measured = [g[0] for g in grads[warm:]]
    total = sum(measured)
    v = sum(g[0].square() for g in grads) / len(grads)
    s = torch.cat([torch.zeros(D // 2), (sum(x.square() for x in measured) / len(measured))[D // 2 :]])
    lag = sum(g[0] for g in grads)[D // 2 :]  # the dropped half's residual at the window's end
    energy = float((total.square() / (v + s)).sum())
    error = float(((total[D // 2 :].square() + lag.square()) / (v + s)[D // 2 :]).sum())
    assert got_pre.progress[3] == pytest.approx(energy / (energy + error), rel=1e-4)
    assert got_raw.progress[3] > 0.999999  # the raw energy does not see the small half
    assert 0.3 < got_pre.progress[3] < 0.7  # about (1 + 1/2) / (1 + 1/2 + 1/2 + lag) when v ~ s there
    assert got_pre.noise == got_raw.noise  # the noise scale stays the raw gradient's


def test_preconditioned_a_lossless_level_stays_at_one_and_a_zero_coordinate_counts_for_nothing() -> None:
    gen = torch.Generator().manual_seed(6)
    probe = WindowProbe({1: "fp16"}, window=4, warm=0, precondition=True)
    result = None
    for _ in range(4):
        g = torch.randn(D, generator=gen)
        g[:100] = 0.0  # never a gradient there (a frozen row): neither v nor s, weight 0, not inf
        result = probe.feed([g])
    assert result is not None and result.progress[1] == pytest.approx(1.0, abs=1e-5)


def _keys(gen: torch.Generator, scale: float = 1.0) -> list[torch.Tensor]:
    """Keys whose sizes are not multiples of a QSGD bucket (gaps in the packed layout)."""
    return [torch.randn(100, generator=gen) * scale, torch.randn(30, 37, generator=gen), torch.randn(5, generator=gen)]


def test_packed_levels_price_what_one_call_per_key_prices() -> None:
    """fp16 is element-wise: packed or per key, the window's residuals and q are the same."""
    gen = torch.Generator().manual_seed(11)
    steps = [_keys(gen) for _ in range(12)]
    results = []
    for packed in (True, False):
        probe = WindowProbe({1: "fp16", 2: "topk:0.1+fp16"}, window=8)
        if not packed:
            probe._packed.clear()
        result = None
        for g in steps:
            result = probe.feed(g) or result
        assert result is not None and not result.interim
        assert len(probe._codecs[1]) == (1 if packed else 3) and len(probe._codecs[2]) == 3  # top-k picks per key
        residual = probe._per_key(probe._residual[1]) if packed else probe._residual[1]
        results.append((result.progress, [r.clone() for r in residual]))
    (q_packed, r_packed), (q_keys, r_keys) = results
    assert q_packed == q_keys
    assert all(torch.equal(a, b) for a, b in zip(r_packed, r_keys))


def test_a_packed_qsgd_bucket_never_spans_two_keys() -> None:
    """A tiny key beside a huge one keeps its own bucket scale: its error stays below its own step."""
    gen = torch.Generator().manual_seed(12)
    probe = WindowProbe({1: "qsgd:4"}, window=4, warm=0)
    small = torch.randn(100, generator=gen) * 1e-3
    for _ in range(3):
        probe.feed([small, torch.randn(30, 37, generator=gen) * 1e3, torch.randn(5, generator=gen)])
    residual = probe._per_key(probe._residual[1])
    assert residual[0].abs().max() <= 2 * small.abs().max() / 15 * 1.01  # one step of the small key's own scale
    gaps = probe._residual[1][0][probe._packing.mask == 0]
    assert gaps.numel() > 0 and not gaps.any()  # the gaps carry nothing over


def test_a_window_prices_a_stream_the_same_whatever_else_draws_random_numbers() -> None:
    """QSGD's rounding noise comes from the window's own generator: the PS's window thread runs
    beside encodes that draw from torch's default one, in no fixed order."""
    gen = torch.Generator().manual_seed(13)
    steps = [_keys(gen) for _ in range(14)]
    results = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        probe = WindowProbe({1: "qsgd:4", 2: "qsgd:8"}, window=8)
        result = None
        for g in steps:
            torch.rand(seed * 7)  # other work drawing from the default generator
            result = probe.feed(g) or result
        assert result is not None and not result.interim
        results.append(result.progress)
    assert results[0] == results[1]


def test_a_failing_codec_drops_its_level_and_its_cost_not_the_window() -> None:
    """A level whose codec fails mid-window leaves it (no q, no step cost charged for it); the
    others run on and are priced and costed as before."""
    gen = torch.Generator().manual_seed(5)
    probe = WindowProbe({1: "winfakefail", 2: "winfakehalf"}, window=4, warm=0, interim=0)
    result = None
    for _ in range(4):
        result = probe.feed([torch.randn(D, generator=gen)])
    assert result is not None and not result.interim
    assert set(result.progress) == {2} and set(result.level_cpu_s) == {2}
    assert result.level_cpu_s[2] > 0 and result.level_steps == 2 + 2 + 2 + 1  # both counted for 3 feeds (the failing one too), then one

"""The downlink's metric on an Adam job: the PS optimizer's sqrt(v_hat) + eps per coordinate
(`adam_metric`), read by the candidate rounds (`DownlinkController.metric`) to weigh a level's
error where Adam's curvature is."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.compression.progress import measure_level
from netsense.ps.downlink import PROGRESS_START_VERSION, START_ROUNDS, DownlinkController
from netsense.ps.optim import adam_metric
from netsense.ps.server import PSServer, ServerSettings
from tests.ps.storehelp import push_keys, step_grads, two_worker_store


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_metric_is_adams_denominator(name: str) -> None:
    s = two_worker_store(optimizer={"name": name, "lr": 0.01, "beta2": 0.99, "eps": 1e-6})
    assert s.update_metric() is None  # no second moment before the first step
    moments = {k: torch.zeros_like(v) for k, v in s.params.items()}
    for step in range(3):
        grads = [step_grads(step, w) for w in (0, 1)]
        for w, g in zip(("w0", "w1"), grads):
            push_keys(s, w, step, g, tuple(g))
        for k in moments:  # the samples-weighted mean of two equal pushes
            mean = (grads[0][k] + grads[1][k]) / 2
            moments[k] = 0.99 * moments[k] + 0.01 * mean * mean
    metric = s.update_metric()
    assert metric is not None and metric.keys() == s.params.keys()
    for k, v in moments.items():
        expected = (v / (1 - 0.99**3)).sqrt() + 1e-6
        torch.testing.assert_close(metric[k], expected)
    metric["a"].zero_()  # a copy: the optimizer's state is not the caller's
    again = s.update_metric()
    assert again is not None and bool((again["a"] > 0).all())


def test_sgd_has_no_metric() -> None:
    s = two_worker_store(optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    for w in ("w0", "w1"):
        push_keys(s, w, 0, step_grads(0, 0), ("a", "b", "c"))
    assert s.update_metric() is None
    assert adam_metric(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), {}) is None


def _update(seed: int) -> dict[str, torch.Tensor]:
    """A rank-1 matrix on the first half of its columns, small noise on the rest."""
    gen = torch.Generator().manual_seed(seed)
    u, v = torch.randn(64, 1, generator=gen), torch.randn(1, 32, generator=gen)
    w = 0.2 * torch.randn(64, 64, generator=gen)
    w[:, :32] += u @ v
    return {"w": w}


def test_the_rounds_weigh_a_levels_error_by_the_metric() -> None:
    """Where the metric is heavy on what a rank-1 fit leaves out (the noisy columns), the round
    prices powersgd:1 lower than in the plain metric, exactly as `measure_level` weighs it."""
    weights = torch.ones(64, 64)
    weights[:, 32:] = 50.0
    params = {"w": torch.zeros(64, 64)}
    prices = {}
    for name, metric in (("plain", None), ("adam", {"w": weights})):
        down = DownlinkController("netsense", ladder="fp32,fp16,powersgd:1")
        down.metric = (lambda m=metric: m) if metric is not None else None  # type: ignore[misc]
        version = PROGRESS_START_VERSION + START_ROUNDS
        down._snapshot = (version, [2], {k: t.clone() for k, t in params.items()})
        update = _update(0)
        new = {k: params[k] + update[k] for k in params}
        down.loop.warm_up([2], [update["w"]])
        down.loop.codecs[2].generator.manual_seed(1)  # type: ignore[attr-defined]  # the same random start of the power iteration
        prices[name] = down.measure(version + 1, new, new)[2]
        codec = make_codec("powersgd:1")
        codec.generator.manual_seed(1)  # type: ignore[attr-defined]
        expected = measure_level(codec, [update["w"]], weights=[weights] if metric else None)
        assert expected is not None and expected.progress is not None
        assert prices[name] == pytest.approx(expected.progress)
    assert prices["adam"] < prices["plain"] - 0.1
    down = DownlinkController("netsense", ladder="fp32,fp16,powersgd:1")
    down.metric = lambda: {"w": torch.ones(3)}  # not the keys' shapes: the plain metric
    assert down._weights(params) is None


def test_the_server_hands_its_store_metric_to_the_downlink() -> None:
    server = PSServer(ServerSettings(policy="netsense"), secret=None)
    assert server.downlink is not None and server.downlink.metric == server.store.update_metric


@pytest.mark.parametrize(("name", "windowed"), [("sgd", True), ("adam", False), ("adamw", False)])
def test_the_server_windows_its_downlink_unless_the_job_runs_adam(name: str, windowed: bool) -> None:
    """Windows price the levels in the plain metric, Adam's rounds in its own (`DownlinkController.windows`)."""
    server = PSServer(ServerSettings(policy="netsense"), secret=None)
    assert server.downlink is not None and server.downlink.windowed  # before INIT names the optimizer
    server.store.initialize({"w": make_codec("fp32").encode(torch.zeros(3, 2))}, {"name": name, "lr": 0.01})
    assert server.downlink.windowed is windowed

"""The downlink feeds its progress windows the parameters; the window's steps are their changes."""

from __future__ import annotations

import torch

from netsense.compression.policy import NetsensePolicy
from netsense.ps.downlink import DownlinkController

LADDER = "fp32,fp16,qsgd:4,powersgd:2,topk:0.01+fp16"


def test_a_window_runs_on_consecutive_updates_and_prices_every_lossy_level() -> None:
    down = DownlinkController("netsense", ladder=LADDER)
    policy = down.policy
    assert isinstance(policy, NetsensePolicy)
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(200, 100, generator=gen), "b": torch.randn(100, generator=gen)}
    direction = {k: torch.randn(v.shape, generator=gen) * 0.01 for k, v in params.items()}
    down.measure(0, params, params)
    assert down.loop.window is None  # not at version 0
    version = 1
    while not any(policy.progress.windowed):
        assert version < 60, "no window finished"
        down.measure(version, params, params)
        noise = {k: torch.randn(v.shape, generator=gen) * 0.01 for k, v in params.items()}
        params = {k: params[k] - direction[k] - noise[k] for k in params}  # the optimizer's step
        version += 1
    assert version == 1 + 25  # the base, W / 2 = 8 steps filling the residuals, 16 measured
    assert policy.progress.windowed == [False, True, True, True, True]
    assert policy.progress.noise is not None and 0.5 < policy.progress.noise.ratio < 2  # tr / |G|^2 = 1
    q = policy.progress.values
    assert q[1] > 0.999 and q[2] > 0.95 and q[4] < q[2]

"""The downlink feeds its progress windows the parameters; the window's steps are their changes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from netsense.compression.policy import NetsensePolicy
from netsense.ps.downlink import DownlinkController

LADDER = "fp32,fp16,qsgd:4,powersgd:2,topk:0.01+fp16"


def test_a_window_runs_on_consecutive_updates_and_prices_every_lossy_level() -> None:
    down = DownlinkController("netsense", ladder=LADDER, windows=True)
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
    assert version == 1 + 17  # the base, then 16 measured (the first window fills no residuals)
    assert policy.progress.windowed == [False, True, True, True, True]
    assert policy.progress.noise is not None and 0.5 < policy.progress.noise.ratio < 2  # tr / |G|^2 = 1
    q = policy.progress.values
    assert q[1] > 0.999 and q[2] > 0.95 and q[4] < q[2]


def test_by_default_windows_price_the_levels_of_an_sgd_job() -> None:
    down = DownlinkController("netsense", ladder=LADDER)
    assert down.windows is None and down.windowed
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(200, 100, generator=gen), "b": torch.randn(100, generator=gen)}
    for version in range(30):
        down.measure(version, params, params)
        params = {k: v - 0.01 * torch.randn(v.shape, generator=gen) - 0.01 for k, v in params.items()}
    assert any(down.policy.progress.windowed)


@pytest.mark.parametrize("windows", [None, False])
def test_an_adam_job_or_windows_off_prices_levels_by_the_rounds(windows: bool | None) -> None:
    """Adam's rounds weigh errors in its metric, which a window does not take (`DownlinkController.windows`):
    no window runs, and the candidate rounds' one-update q price the levels."""
    down = DownlinkController("netsense", ladder=LADDER, windows=windows)
    down.per_coordinate = lambda: True
    policy = down.policy
    assert isinstance(policy, NetsensePolicy) and not down.windowed
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(200, 100, generator=gen), "b": torch.randn(100, generator=gen)}
    shadow = {k: v.clone() for k, v in params.items()}
    for version in range(30):
        down.measure(version, params, shadow)
        assert down.loop.window is None
        params = {k: v - 0.01 * torch.randn(v.shape, generator=gen) for k, v in params.items()}
    assert not any(policy.progress.windowed) and not any(policy.progress.interim)
    assert all(policy.progress.measured)  # the round at update 2, measured at 3


def _updates(versions: int) -> Iterator[dict[str, torch.Tensor]]:
    """The same parameters, updated in place (as the store's optimizer does) after each yield."""
    gen = torch.Generator().manual_seed(1)
    params = {"w": torch.randn(200, 100, generator=gen), "b": torch.randn(100, generator=gen)}
    for _ in range(versions):
        yield params
        for v in params.values():
            v.sub_(0.01 * torch.randn(v.shape, generator=gen) + 0.01)


@pytest.mark.parametrize("loop_runs_between", [True, False], ids=["loop-runs", "thread-behind"])
def test_on_a_running_loop_the_window_steps_run_on_the_window_thread_with_the_same_result(loop_runs_between: bool) -> None:
    """The PS's loop hands window steps to a thread (they held it ~50 ms per update) and copies the
    parameters it hands over (the store updates them in place); the q it learns is the same. When
    the thread falls behind (the loop never runs between updates) the loop waits for it instead of
    feeding the probe itself: before, it fed the same probe from two threads at once."""
    import asyncio
    import threading

    here = DownlinkController("netsense", ladder=LADDER, windows=True)
    for version, params in enumerate(_updates(27)):
        here.measure(version, params, params)
    assert any(here.policy.progress.windowed)

    threads: set[str] = set()
    away = DownlinkController("netsense", ladder=LADDER, windows=True)
    feed = away.loop.window_due  # the probe is made on the loop; record where its steps run

    def due(version: int) -> bool:
        ok = feed(version)
        if ok and away.loop.window is not None and not hasattr(away.loop.window, "_traced"):
            probe = away.loop.window
            inner = probe.feed

            def traced(tensors):  # type: ignore[no-untyped-def]
                threads.add(threading.current_thread().name)
                return inner(tensors)

            probe.feed = traced  # type: ignore[method-assign]
            probe._traced = True  # type: ignore[attr-defined]
        return ok

    away.loop.window_due = due  # type: ignore[method-assign]

    async def settled() -> None:
        for _ in range(2500):  # the thread's results land on the loop
            if away._window_queued == 0:
                return
            await asyncio.sleep(0.002)

    async def main() -> None:
        for version, params in enumerate(_updates(27)):
            away.measure(version, params, params)
            if loop_runs_between:
                await settled()
        await settled()

    asyncio.run(main())
    away.close()
    assert threads and all(name.startswith("netsense-window") for name in threads), threads
    assert away.policy.progress.windowed == here.policy.progress.windowed
    # To float round-off (the thread's reductions may split differently). Handed the live tensors
    # instead of copies, an update applied under the thread's feet failed this in 2 of 3 runs.
    assert away.policy.progress.values == pytest.approx(here.policy.progress.values, rel=1e-5)

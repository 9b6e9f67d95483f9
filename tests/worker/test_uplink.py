"""`UplinkController` without a connection: startup samples, progress measurement hand-off."""

from __future__ import annotations

import torch

from netsense.compression.ladder import Ladder
from netsense.compression.link import LinkState
from netsense.compression.policy import NetsensePolicy, make_policy
from netsense.worker.uplink import STARTUP_STEPS, UplinkController

S = 1_000_000


def controller() -> tuple[UplinkController, NetsensePolicy]:
    policy = make_policy("netsense", Ladder.parse("fp32,fp16,qsgd:4,topk:0.01+fp16"))
    assert isinstance(policy, NetsensePolicy)
    return UplinkController(policy, payload_bytes=S), policy


def test_first_push_is_not_a_bandwidth_sample() -> None:
    """The first push runs in slow start after the handshake: a low rate that must not seed the estimate."""
    up, policy = controller()
    link = LinkState(0.0, None, 0.002, 0.002)
    for step in range(STARTUP_STEPS + 1):
        up.choose(link, started=float(step))
        up.observe(bytes_sent=S, comm_s=1.0 if step < STARTUP_STEPS else 0.102)  # 1 MB/s, then 10 MB/s
    assert policy.bandwidth.update(link) == 1_000_000 / 0.1


def test_candidates_are_measured_and_reported() -> None:
    up, policy = controller()
    assert up.progress_candidates() == [1, 2, 3]  # step 0: every lossy level
    gen = torch.Generator().manual_seed(0)
    measured = up.measure_progress([2, 3], [torch.randn(300, 200, generator=gen), torch.randn(5000, generator=gen)])
    assert set(measured) == {2, 3} and measured[2] > 0.9 and 0.01 < measured[3] < 0.5
    assert policy.progress.values[2] == measured[2] and policy.progress.measured[3]
    up.observe_progress(3, 0.5)
    assert policy.progress.values[3] == 0.3 * 0.5 + 0.7 * measured[3]
    up.observe_progress(None, 0.5)  # an off-ladder level: nothing to update

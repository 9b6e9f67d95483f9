"""The uplink feeds its progress windows each step's local gradient, before error feedback."""

from __future__ import annotations

import torch

from netsense.compression.policy import NetsensePolicy, make_policy
from netsense.compression.policy.ladder import Ladder
from netsense.worker.encoding import GradientEncoder
from netsense.worker.layout import key_layout
from netsense.worker.uplink import UplinkController

LADDER = Ladder.parse("fp32,fp16,qsgd:4,powersgd:2")


def test_track_progress_feeds_the_raw_gradient_to_the_window() -> None:
    policy = make_policy("netsense", LADDER)
    assert isinstance(policy, NetsensePolicy)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    uplink = UplinkController(policy, payload_bytes=4 * sum(p.numel() for p in model.parameters()))
    enc = GradientEncoder(key_layout(model), uplink)
    gen = torch.Generator().manual_seed(0)
    fed: list[list[torch.Tensor]] = []
    feed = uplink.loop.feed_window
    uplink.loop.feed_window = lambda tensors: (fed.append([t.clone() for t in tensors]), feed(tensors))[1]  # type: ignore[method-assign]
    for step in range(30):
        model.zero_grad()
        model(torch.randn(8, 32, generator=gen)).square().mean().backward()
        enc.encode_rest("qsgd:4", {}, None)  # leaves a residual: what is fed must not hold it
        enc.track_progress(LADDER.find("qsgd:4"), "qsgd:4")
        assert len(fed) == min(step + 1, 16)  # from step 0 (a window is CPU work, no bandwidth evidence), W = 16 steps
        if len(fed) == step + 1:
            grads = [p.grad for p in model.parameters()]
            assert all(torch.equal(a, b.reshape(a.shape)) for a, b in zip(fed[-1], grads))
        uplink._step += 1  # what observe() counts after a push
    assert len(fed) >= 16 and policy.progress.windowed == [False, True, True, True]


def test_the_sent_level_is_priced_from_its_own_error_feedback() -> None:
    """Every W steps at one lossy level the policy gets that level's q_W from the encoder's error
    feedback (netsense.compression.sentwindow); `sent_window_drift = 0` keeps no such sums."""
    from netsense.compression.policy.netsense_settings import NetsensePolicySettings
    from netsense.worker.encoding import sent_window_for

    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    slots = key_layout(model)
    payload = 4 * sum(s.numel for s in slots)
    off = UplinkController(NetsensePolicy(LADDER, NetsensePolicySettings(sent_window_drift=0)), payload_bytes=payload)
    assert sent_window_for(100, off) is None
    policy = make_policy("netsense", LADDER)
    assert isinstance(policy, NetsensePolicy)
    uplink = UplinkController(policy, payload_bytes=payload)
    enc = GradientEncoder(slots, uplink, sent_window=sent_window_for(sum(s.numel for s in slots), uplink))
    assert enc.sent_window is not None and enc.sent_window.window == 16
    got: list[tuple[int, float]] = []
    observe = policy.observe_sent_window
    policy.observe_sent_window = lambda *, level, progress: (got.append((level, progress)), observe(level=level, progress=progress))[1]  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(0)
    level = LADDER.find("powersgd:2")
    for _ in range(40):
        model.zero_grad()
        model(torch.randn(8, 32, generator=gen)).square().mean().backward()
        enc.encode_rest("powersgd:2", {}, None)
        enc.track_progress(level, "powersgd:2")
        uplink._step += 1
    assert [lv for lv, _ in got] == [level, level] and all(0 < q <= 1 for _, q in got)

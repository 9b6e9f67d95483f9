"""The hand-checkable ladder the probe tests share: the step-time law (q = 1 everywhere, as
tests/compression/test_policy.py) over five levels. At 20 Mbit/s and a 4.5 MB payload it holds
topk (40 kB, app-limited) and probes with qsgd:4 (607 kB)."""

from __future__ import annotations

from netsense.compression.policy import NetsensePolicy, make_policy
from netsense.compression.policy.ladder import Ladder, Level

MBIT = 1e6 / 8
S = 4_500_000  # dense fp32 payload, bytes
TC = 0.05
RTT = 0.02

LADDER = Ladder(
    (
        Level("fp32", 1.0, 0.0005, 0.0005, True),
        Level("fp16", 0.5, 0.002, 0.001, False),
        Level("qsgd:8", 0.26, 0.005, 0.002, False),
        Level("qsgd:4", 0.135, 0.005, 0.002, False),
        Level("topk:0.01+fp16", 0.009, 0.01, 0.002, False),
    )
)


def cadence_policy(**settings: object) -> NetsensePolicy:
    """netsense on `LADDER` with the step-time law, probing on a 2-step cadence without back-off;
    `settings` override (and add to) those. No step overhead: these tests' clock ticks a second a
    step whatever the predictions, which `StepOverhead` would read as 0.9 s left out of each."""
    settings = {
        "progress_aware": False, "probe_interval": 2, "probe_interval_s": 0, "probe_backoff_max": 1, "overhead_window": 0,
        **settings,
    }  # fmt: skip
    p = make_policy("netsense", LADDER, **settings)
    assert isinstance(p, NetsensePolicy)
    return p

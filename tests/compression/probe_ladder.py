"""The hand-checkable ladder the probe tests share: the step-time law (q = 1 everywhere, as
tests/compression/test_policy.py) over five levels. At 20 Mbit/s and a 4.5 MB payload it holds
topk (40 kB, app-limited) and probes with qsgd:4 (607 kB)."""

from __future__ import annotations

from netsense.compression.policy.ladder import Ladder, Level

LADDER = Ladder(
    (
        Level("fp32", 1.0, 0.0005, 0.0005, True),
        Level("fp16", 0.5, 0.002, 0.001, False),
        Level("qsgd:8", 0.26, 0.005, 0.002, False),
        Level("qsgd:4", 0.135, 0.005, 0.002, False),
        Level("topk:0.01+fp16", 0.009, 0.01, 0.002, False),
    )
)

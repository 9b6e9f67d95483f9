"""Write ``cellular.mahimahi``: a cellular-like link for `netsense bench matrix` (docs/BENCHMARKS.md).

Why a generated trace: the matrix needs a dynamic link that no policy was tuned on, reproducible
byte for byte, and regenerable when its shape is questioned. The model is a generic one of LTE
downlink capacity, not fitted to any job: the log of the rate follows a mean-reverting random walk
(Ornstein-Uhlenbeck, time constant ``TAU_S``, around ``MEDIAN_MBIT``) sampled every ``SEGMENT_S``,
clipped to [``LOW_MBIT``, ``HIGH_MBIT``], with an occasional handover-like fade (a drop to the
floor for a fraction of a second). Over its ``PERIOD_S`` it swings several times between ~5 and
60 Mbit/s. The file is Mahimahi's format: one line per millisecond timestamp at which one 1500-byte
packet may leave (repeated for several in that ms); Mahimahi and `netsense emulate` loop it with
the period of its last timestamp.

Regenerate (deterministic, from the seed):  python examples/traces/make_cellular.py
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

SEED = 14
PERIOD_S = 30.0
SEGMENT_S = 0.1
MEDIAN_MBIT = 22.0
LOW_MBIT, HIGH_MBIT = 5.0, 60.0
TAU_S = 3.0
"""Mean-reversion time constant of the log rate: how long a good or bad spell lasts."""
SIGMA = 0.55
"""Stationary standard deviation of the log rate (natural log units)."""
FADE_PER_S = 0.08
"""Rate of handover-like fades (per second), each 0.2-0.8 s at the floor."""
PACKET_BYTES = 1500
OUT = Path(__file__).with_name("cellular.mahimahi")


def rate_curve(seed: int = SEED) -> list[float]:
    """The rate of each ``SEGMENT_S`` segment over one period, in Mbit/s."""
    rng = random.Random(seed)
    n = round(PERIOD_S / SEGMENT_S)
    a = math.exp(-SEGMENT_S / TAU_S)
    noise = SIGMA * math.sqrt(1.0 - a * a)
    x = 0.0
    rates: list[float] = []
    fade_left = 0
    for _ in range(n):
        x = a * x + noise * rng.gauss(0.0, 1.0)
        if fade_left == 0 and rng.random() < FADE_PER_S * SEGMENT_S:
            fade_left = rng.randint(2, 8)
        mbit = LOW_MBIT if fade_left else min(HIGH_MBIT, max(LOW_MBIT, MEDIAN_MBIT * math.exp(x)))
        fade_left = max(0, fade_left - 1)
        rates.append(mbit)
    return rates


def opportunities(rates: list[float]) -> list[int]:
    """Millisecond timestamps 1..period of the packets the curve's cumulative bytes allow."""
    seg_ms = round(SEGMENT_S * 1000)
    out: list[int] = []
    cum = 0.0
    sent = 0
    for i, mbit in enumerate(rates):
        per_ms = mbit * 1e6 / 8 / 1000
        for j in range(1, seg_ms + 1):
            cum += per_ms
            ms = i * seg_ms + j
            while (sent + 1) * PACKET_BYTES <= cum + 1e-6:
                sent += 1
                out.append(ms)
    period_ms = len(rates) * seg_ms
    if not out or out[-1] != period_ms:
        out.append(period_ms)  # the last timestamp sets Mahimahi's loop period
    return out


def mean_mbit(rates: list[float]) -> float:
    """The curve's time-weighted mean rate (every segment has the same length)."""
    return sum(rates) / len(rates)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    rates = rate_curve()
    out.write_text("".join(f"{ms}\n" for ms in opportunities(rates)))
    print(
        f"{out}: {PERIOD_S:.0f} s loop, mean {mean_mbit(rates):.1f} Mbit/s, "
        f"min {min(rates):.1f}, max {max(rates):.1f} (100 ms segments)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The downlink's early rounds (`EARLY_ROUNDS`): between the start rounds and the `progress_every`
schedule, rounds whose figures replace the levels' estimates (docs/POLICIES.md, "Candidate rounds")."""

from __future__ import annotations

import pytest
import torch

from netsense.compression.policy import NetsensePolicy
from netsense.compression.policy.progress import ProgressEstimate
from netsense.compression.policy.ladder import Ladder
from netsense.ps.downlink import EARLY_ROUNDS, PROGRESS_START_VERSION, DownlinkController

LADDER = "fp32,fp16,qsgd:8,qsgd:4,powersgd:2"


def low_rank(seed: int, rank: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(64, rank, generator=gen) @ torch.randn(rank, 48, generator=gen)
    return {"w": w, "b": torch.randn(48, generator=gen)}


def run(down: DownlinkController, updates: list[dict[str, torch.Tensor]]) -> dict[int, dict[int, float]]:
    """Apply `updates` one per version from the start, each encoded exactly (shadow = parameters
    before it); the q each version's measure reported, by version."""
    params = {k: torch.zeros_like(t) for k, t in updates[0].items()}
    out = {}
    for i, update in enumerate(updates):
        version = PROGRESS_START_VERSION + i
        out[version] = down.measure(version, params, {k: t.clone() for k, t in params.items()})
        params = {k: params[k] + 0.01 * update[k] for k in params}
    return out


def test_an_early_round_replaces_the_start_rounds_figures() -> None:
    """A fresh model's first updates of rank 1 price powersgd:2 as lossless; from update 2 on they
    are of full rank. Without early rounds that price stands until update 50; the round at update
    4 (measured on update 4, reported at 5) replaces it, and the one at 8 replaces that."""
    down = DownlinkController("netsense", ladder=LADDER)
    policy = down.policy
    assert isinstance(policy, NetsensePolicy)
    updates = [low_rank(0, 1), low_rank(1, 1)] + [low_rank(seed, 48) for seed in range(2, 12)]
    measured = run(down, updates)
    start = PROGRESS_START_VERSION
    assert measured[start + 1][4] > 0.99  # the start round on the rank-1 update 0 (interim)
    assert measured[start + 2][4] > 0.99  # ...and on update 1: the estimate
    assert 4 in EARLY_ROUNDS and 8 in EARLY_ROUNDS
    early = measured[start + 5][4]
    assert early < 0.8
    assert measured[start + 9][4] == pytest.approx(policy.progress.values[4])  # replaced, not folded
    assert policy.progress.measured[4] and policy.progress.one_step[4] == pytest.approx(measured[start + 9][4])
    for version in range(start + 3, start + 12):
        if version - 1 - start not in EARLY_ROUNDS:
            assert measured[version] == {}  # no round off the early ones


def test_a_restart_figure_replaces_the_estimate_unless_a_window_or_table_prices_the_level() -> None:
    ladder = Ladder.parse(LADDER)
    p = ProgressEstimate(ladder, alpha=0.3)
    p.update(4, 0.9)
    p.update(4, 0.5)
    assert p.values[4] == pytest.approx(0.3 * 0.5 + 0.7 * 0.9)
    p.update(4, 0.4, restart=True)
    assert p.values[4] == p.one_step[4] == pytest.approx(0.4)
    p.update(4, 0.6)
    assert p.values[4] == pytest.approx(0.3 * 0.6 + 0.7 * 0.4)
    p.update_window(4, 0.95)
    p.update(4, 0.2, restart=True)
    assert p.values[4] == pytest.approx(0.95) and p.one_step[4] == pytest.approx(0.2)
    p.pin(3, 0.7)
    p.update(3, 0.1, restart=True)
    assert p.values[3] == pytest.approx(0.7)

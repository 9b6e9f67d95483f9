"""`PolicyLoop`, the bookkeeping both directions share, and the decision log it writes: no connection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import netsense.compression  # noqa: F401  (registers the real codecs the ladder names)
from netsense.compression.policy import ChooseRequest, Decision, Policy, SendReport
from netsense.compression.policy.decisionlog import read_decision_log
from netsense.compression.policy.ladder import Ladder
from netsense.compression.policy.link import LinkState
from netsense.compression.policy.loop import COMPUTE_EWMA_ALPHA, PolicyLoop

LINK = LinkState(time_s=1.0, bandwidth_Bps=1e6, min_rtt_s=0.01, srtt_s=0.01)


class Recorder(Policy):
    """fp32 always; keeps what it was asked and told."""

    def __init__(self) -> None:
        super().__init__(Ladder.parse("fp32,qsgd:8,topk:0.1+fp16"), name="recorder")
        self.requests: list[ChooseRequest] = []
        self.reports: list[SendReport] = []
        self.costs: list[tuple[int, int, float | None, float | None]] = []

    def choose(self, request: ChooseRequest) -> Decision:
        self.requests.append(request)
        return self._decision(request, level_index=0, level=self.ladder[0], reason="test", bandwidth_Bps=None)

    def observe(self, report: SendReport) -> None:
        self.reports.append(report)

    def observe_costs(
        self, *, level: int, dense_bytes: int, encode_s: float | None = None, decode_s: float | None = None
    ) -> None:
        self.costs.append((level, dense_bytes, encode_s, decode_s))


def test_compute_time_is_an_ewma_and_zero_before_any_sample() -> None:
    policy = Recorder()
    loop = PolicyLoop(policy, direction="up")
    loop.choose(LINK, payload_bytes=1000, step=0)
    loop.time_compute(1.0)
    loop.time_compute(0.0)
    loop.choose(LINK, payload_bytes=1000, step=1)
    assert [r.compute_s for r in policy.requests] == [0.0, pytest.approx(1 - COMPUTE_EWMA_ALPHA)]
    assert [(r.step, r.payload_bytes, r.overlap) for r in policy.requests] == [(0, 1000, False), (1, 1000, False)]
    loop.restart_compute()
    loop.time_compute(0.25)
    assert loop.compute_s == 0.25


def test_a_levels_first_encode_is_not_its_cost() -> None:
    policy = Recorder()
    loop = PolicyLoop(policy, direction="up")
    loop.observe_encode(1, 4000, 0.5)  # builds and warms the codecs: skipped
    loop.observe_encode(1, 4000, 0.002)
    loop.observe_encode(2, 4000, 0.7)
    assert policy.costs == [(1, 4000, 0.002, None)]


def test_feedback_histogram_and_log(tmp_path: Path) -> None:
    policy = Recorder()
    path = tmp_path / "up.jsonl"
    loop = PolicyLoop(policy, direction="up", decision_log=path, log_fields={"rank": 3})
    decision = loop.choose(LINK, payload_bytes=1000, step=7)
    loop.observe(decision, bytes_sent=1000, comm_s=0.02)
    loop.count(decision.spec)
    loop.count(decision.spec)
    rec = loop.write(decision, LINK, bytes_sent=1000, comm_s=0.02, version=8)
    loop.close()
    assert policy.reports == [SendReport(step=7, level=0, bytes_sent=1000, comm_s=0.02)]
    assert loop.levels == {"fp32": 2}
    assert read_decision_log(path) == [rec]
    assert rec is not None and (rec["direction"], rec["rank"], rec["version"], rec["step"]) == ("up", 3, 8, 7)
    unlogged = PolicyLoop(Recorder(), direction="down")
    assert unlogged.write(decision, LINK, bytes_sent=None, comm_s=None) is None


def test_candidates_are_warmed_up_once_and_measured() -> None:
    policy = Recorder()
    loop = PolicyLoop(policy, direction="down")
    tensors = [torch.randn(300, 200, generator=torch.Generator().manual_seed(0))]
    loop.warm_up([1], tensors)
    codec = loop.codecs[1]
    measured = loop.measure([1, 2], tensors)
    assert loop.codecs[1] is codec and sorted(loop.codecs) == [1, 2]
    assert sorted(measured) == [1, 2] and measured[1] > 0.9 and measured[2] < 0.5
    assert [c[0] for c in policy.costs] == [1, 2]  # one timing per level measured, none for the warm-ups

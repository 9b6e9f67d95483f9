"""The candidate round runs before the choice it informs (worker/optimizer.py, worker/uplink.py
`PROGRESS_START_STEP`): the first step's decision already carries every level's measured q."""

from __future__ import annotations

import pytest
import torch

from netsense.worker.optimizer import NetSenseOptimizer


def test_the_first_decision_is_taken_on_the_first_rounds_measurements(ps) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    # No start-up probe: the first step then goes out at the unknown-bandwidth level, which the round decides.
    with NetSenseOptimizer(
        model, connect=ps.connect_settings(), worker_id="w0", policy="netsense", policy_settings={"start_probe": False}
    ) as opt:
        policy = opt.uplink.policy
        prior = list(policy.progress.values)
        loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
        loss.backward()
        opt.step(samples=32)
        decision, _ = opt.uplink.last  # type: ignore[misc]
        assert decision.step == 0 and decision.reason == "unknown-bandwidth"
        q8 = policy.ladder.find("qsgd:8")
        assert decision.progress_levels is not None and decision.progress_levels != tuple(prior)
        assert all(policy.progress.measured)  # every lossy level measured before the first push
        # 8-bit measured lossless on a real gradient: the bandwidth-unknown step sends it, not fp16.
        assert decision.progress_levels[q8] >= 1 - policy.settings.progress_tol
        assert decision.spec == "qsgd:8"


def test_the_round_reports_both_norms_to_a_policy_that_reads_them(ps) -> None:  # type: ignore[no-untyped-def]
    """gravac's gain needs ||g|| and ||g + r|| of the round's step (`Policy.observe_round_norms`):
    at step 0 no residual yet (equal norms), then top-k's residual makes them differ."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", policy="gravac") as opt:
        policy = opt.uplink.policy
        assert policy.wants_round_norms
        seen: list[tuple[int, float, float]] = []
        policy.observe_round_norms = lambda *, step, gradient_norm, input_norm: seen.append(  # type: ignore[method-assign]
            (step, gradient_norm, input_norm)
        )
        norms = []
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
            loss.backward()
            norms.append(sum(float(p.grad.pow(2).sum()) for p in model.parameters()) ** 0.5)  # type: ignore[union-attr]
            opt.step(samples=32)
        assert [s for s, _, _ in seen] == [0, 1]
        assert seen[0][1] == seen[0][2] == pytest.approx(norms[0], rel=1e-5)
        assert seen[1][1] == pytest.approx(norms[1], rel=1e-5)
        assert abs(seen[1][2] - seen[1][1]) > 1e-3 * seen[1][1]  # the residual of top-k 10 %


@pytest.mark.parametrize(("optimizer", "weighed"), [({"name": "adam", "lr": 0.001}, True), ({"name": "sgd", "lr": 0.05}, False)])
def test_an_adam_jobs_windows_price_levels_in_adams_metric(ps, optimizer: dict[str, object], weighed: bool) -> None:  # type: ignore[no-untyped-def]
    """The uplink's windows weigh energies as the PS's optimizer applies them (docs/POLICIES.md,
    "Windowed progress"): per coordinate for Adam, raw for SGD."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    with NetSenseOptimizer(model, connect=ps.connect_settings(), worker_id="w0", policy="netsense", optimizer=optimizer) as opt:
        loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
        loss.backward()
        opt.step(samples=32)
        window = opt.uplink.loop.window
        assert window is not None and window.fed == 1  # the first window started with the run
        assert window.precondition is weighed

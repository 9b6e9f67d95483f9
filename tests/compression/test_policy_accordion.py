"""accordion: Accordion's critical-regime rule on synthetic gradient-norm streams (docs/POLICIES.md)."""

from __future__ import annotations

import pytest

from netsense.compression import DEFAULT_LADDER, Ladder, make_policy
from netsense.compression.policy import AccordionPolicy, ChooseRequest
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError

LADDER = Ladder.parse(DEFAULT_LADDER)


def _spec(policy: AccordionPolicy, step: int) -> str:
    link = LinkState(time_s=float(step), bandwidth_Bps=2.5e6, min_rtt_s=0.02, srtt_s=0.02)
    return policy.choose(ChooseRequest(link=link, payload_bytes=4 << 20, compute_s=0.01, step=step)).spec


def _run(norms: list[float], **settings: object) -> list[str]:
    """The spec chosen at each step when step t's norm is observed after its choice."""
    policy = make_policy("accordion", LADDER, **settings)
    assert isinstance(policy, AccordionPolicy)
    out = []
    for step, norm in enumerate(norms):
        out.append(_spec(policy, step))
        policy.observe_gradient(step=step, norm=norm)
    return out


def test_fast_changing_norm_stays_light() -> None:
    # The norm halves every window of 5 steps: |prev - new| / prev = 0.5 >= eta at every check.
    norms = [10.0 * 0.5 ** (t // 5) for t in range(40)]
    assert set(_run(norms, interval=5)) == {"powersgd:2"}


def test_flat_norm_goes_heavy_at_the_second_check() -> None:
    specs = _run([3.0] * 30, interval=5)
    # First check (after step 4): nothing to compare, critical; second (after step 9): ratio 0.
    assert specs[:10] == ["powersgd:2"] * 10
    assert specs[10:] == ["powersgd:1"] * 20


def test_switch_happens_at_the_check_interval() -> None:
    # Flat for 4 windows, then the norm jumps x3 (a new critical regime) and stays there.
    norms = [1.0] * 20 + [3.0] * 20
    specs = _run(norms, interval=5, light="qsgd:8", heavy="qsgd:4")
    assert specs[9] == "qsgd:8" and specs[10] == "qsgd:4"  # heavy from the second check on
    assert specs[20:25] == ["qsgd:4"] * 5  # the jump is in the window, not yet checked
    assert specs[25:30] == ["qsgd:8"] * 5  # check after step 24: ratio 2 >= 0.5
    assert specs[30:] == ["qsgd:4"] * 10  # flat again at 3.0: stable


def test_below_eta_is_stable_and_zero_previous_is_critical() -> None:
    policy = make_policy("accordion", LADDER, interval=1, eta=0.5)
    for step, norm in enumerate([1.0, 1.4, 0.0, 5.0]):
        policy.observe_gradient(step=step, norm=norm)
    assert policy.critical  # 0 -> 5: previous norm 0 counts as critical
    policy.observe_gradient(step=4, norm=7.4)  # 5 -> 7.4: ratio 0.48 < 0.5
    assert not policy.critical and policy.ratio == pytest.approx(0.48)


def test_bad_norms_are_dropped() -> None:
    policy = make_policy("accordion", LADDER, interval=2)
    for bad in (float("nan"), float("inf"), -1.0):
        policy.observe_gradient(step=0, norm=bad)
    assert policy._window == []


def test_no_norms_holds_the_light_level() -> None:
    policy = make_policy("accordion", LADDER)
    assert all(_spec(policy, t) == "powersgd:2" for t in range(50))


def test_only_accordion_asks_for_norms() -> None:
    assert make_policy("accordion", LADDER).wants_gradient_norm
    for name in ("none", "fp16", "dc2", "netsense", "netsenseml-paper", "gravac"):
        assert not make_policy(name, LADDER).wants_gradient_norm


@pytest.mark.parametrize(
    "settings",
    [{"eta": 0.0}, {"interval": 0}, {"interval": 2.5}, {"light": "nosuch:1"}, {"heavy": ""}, {"nosuch": 1}],
)
def test_bad_settings_are_config_errors(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make_policy("accordion", LADDER, **settings)

"""`SitePhases`: a relayed site step's phases from the relay's clock readings."""

from __future__ import annotations

import pytest

from netsense.relay.phases import SitePhases


def test_phases_of_consecutive_steps() -> None:
    """gather runs from the last install to the next take; update is what the push leaves of the
    take-to-update span; install from the update to the pulls answered."""
    p = SitePhases()
    first = p.record(taken=10.0, push_s=0.15, updated=10.4, installed=10.41)
    assert first.gather_s is None  # nothing installed before the first step
    assert first.push_s == 0.15 and first.update_s == pytest.approx(0.25) and first.install_s == pytest.approx(0.01)
    second = p.record(taken=10.46, push_s=0.2, updated=10.9, installed=10.93)
    assert second.gather_s == pytest.approx(0.05) and second.update_s == pytest.approx(0.24)
    m = p.medians()
    assert m is not None and m["steps"] == 2 and m["gather_s"] == pytest.approx(0.05)
    assert m["push_s"] == pytest.approx(0.175) and m["install_s"] == pytest.approx(0.02)
    assert p.summary().startswith("2 steps; median ms: gather 50.0, push 175.0, update 245.0, install 20.0")


def test_untimed_push_and_resync_leave_their_phases_out() -> None:
    """A push retried after a reconnect has no push time (nor update); a resync restarts gather."""
    p = SitePhases()
    assert p.medians() is None and p.summary() == "no site step yet"
    t = p.record(taken=1.0, push_s=None, updated=1.5, installed=1.5)
    assert t.push_s is None and t.update_s is None
    m = p.medians()
    assert m is not None and "push_s" not in m and "update_s" not in m and "gather_s" not in m
    p.resync()
    assert p.record(taken=3.0, push_s=0.1, updated=3.3, installed=3.31).gather_s is None
    assert p.record(taken=3.5, push_s=0.1, updated=3.8, installed=3.81).gather_s == pytest.approx(0.19)


def test_medians_over_the_latest_window() -> None:
    """The window keeps the latest steps (a long job's present); the count is the whole run's."""
    p = SitePhases(window=3)
    for i, push in enumerate([9.0, 9.0, 0.1, 0.2, 0.3]):
        p.record(taken=10.0 * i, push_s=push, updated=10.0 * i + push + 0.5, installed=10.0 * i + push + 0.5)
    m = p.medians()
    assert m is not None and m["steps"] == 5 and m["push_s"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        SitePhases(window=0)

"""A key's codec at a new level takes over what the last level's knew (`KeyCodecs`,
`Codec.follow`): a PowerSGD rank resumed after another starts from that rank's basis
(docs/POLICIES.md, "Switching levels")."""

from __future__ import annotations

import torch

import netsense.compression  # noqa: F401  (registers the codecs)
from netsense.compression import make_codec
from netsense.compression.keycodecs import KeyCodecs
from netsense.compression.lowrank import PowerSGD

ROWS, COLS = 48, 40


def _matrix(direction: torch.Tensor, seed: int) -> torch.Tensor:
    """A strong rank-2 signal whose top right singular vector is `direction`, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(ROWS, 2, generator=gen)).Q
    other = torch.randn(COLS, generator=torch.Generator().manual_seed(99))
    other -= (other @ direction) * direction
    v = torch.stack([direction, other / other.norm()], dim=1)
    return u @ torch.diag(torch.tensor([10.0, 4.0])) @ v.T + 0.05 * torch.randn(ROWS, COLS, generator=gen)


def _error(codec: PowerSGD, m: torch.Tensor) -> float:
    return float((m - codec.roundtrip(m)).square().sum() / m.square().sum())


def _unit(seed: int) -> torch.Tensor:
    x = torch.randn(COLS, generator=torch.Generator().manual_seed(seed))
    return x / x.norm()


def test_rank_1_resumed_after_rank_2_starts_from_rank_2s_basis_not_its_own_stale_one() -> None:
    old, new = _unit(1), _unit(2)  # the gradient's top direction before and after
    errors = {}
    for follow in (True, False):
        p1, p2 = make_codec("powersgd:1"), make_codec("powersgd:2")
        assert isinstance(p1, PowerSGD) and isinstance(p2, PowerSGD)
        for step in range(6):  # rank 1 learns the old direction
            p1.roundtrip(_matrix(old, step))
        for step in range(6, 26):  # then rank 2 runs while the direction moves
            p2.roundtrip(_matrix(new, step))
        if follow:
            p1.follow(p2)
        errors[follow] = _error(p1, _matrix(new, 26))
    best = make_codec("powersgd:1")
    for step in range(27):  # rank 1 run throughout: what the resumed one should match
        continuous = _error(best, _matrix(new if step >= 6 else old, step))  # type: ignore[arg-type]
    assert errors[True] < 0.2 and abs(errors[True] - continuous) < 0.02
    assert errors[False] > 2 * errors[True]  # the stale basis still points the old way


def test_a_higher_rank_keeps_the_lower_ranks_columns_first_and_its_own_after() -> None:
    p2, p4 = make_codec("powersgd:2"), make_codec("powersgd:4")
    assert isinstance(p2, PowerSGD) and isinstance(p4, PowerSGD)
    p4.roundtrip(_matrix(_unit(1), 0))
    own = p4._q.clone()  # type: ignore[union-attr]
    p2.roundtrip(_matrix(_unit(2), 1))
    p4.follow(p2)
    assert p4._q is not None and p4._q.shape == (COLS, 4)
    assert torch.equal(p4._q[:, :2], p2._q)  # type: ignore[index]
    assert torch.equal(p4._q[:, 2:], own[:, 2:])
    fresh = make_codec("powersgd:4")
    fresh.follow(p2)  # no basis of its own yet: random columns after rank 2's
    assert isinstance(fresh, PowerSGD) and fresh._q is not None and fresh._q.shape == (COLS, 4)
    m = _matrix(_unit(2), 2)
    assert torch.isfinite(fresh.roundtrip(m)).all()


def test_follow_ignores_what_it_cannot_use() -> None:
    p1 = make_codec("powersgd:1")
    assert isinstance(p1, PowerSGD)
    p1.follow(make_codec("qsgd:4"))  # another kind of codec
    p1.follow(make_codec("powersgd:2"))  # a rank with no basis yet
    assert p1._q is None
    wide = make_codec("powersgd:2")
    wide.roundtrip(torch.randn(8, 100))
    p1.follow(wide)  # a basis of another matrix's shape: dropped at the next encode, no crash
    m = _matrix(_unit(3), 0)
    assert torch.isfinite(p1.roundtrip(m)).all() and p1._q is not None and p1._q.shape == (COLS, 1)


class _Recorder(PowerSGD):
    def __init__(self) -> None:
        super().__init__("powersgd:1", 1, torch.float32)
        self.followed: list[object] = []

    def follow(self, previous: object) -> None:  # type: ignore[override]
        self.followed.append(previous)


def test_key_codecs_hand_over_only_when_a_keys_level_changes() -> None:
    codecs = KeyCodecs()
    a1, a2 = codecs.get("a", "powersgd:1"), codecs.get("a", "powersgd:2")
    assert codecs.get("a", "powersgd:2") is a2 and ("a", "powersgd:1") in codecs and len(codecs) == 2
    b1 = codecs.get("b", "powersgd:1")
    assert b1 is not a1  # one instance per key
    assert isinstance(a1, PowerSGD) and isinstance(a2, PowerSGD)
    a2.roundtrip(_matrix(_unit(1), 0))
    assert a1._q is None
    back = codecs.get("a", "powersgd:1")  # the level changes: rank 1 takes rank 2's basis
    assert back is a1 and a1._q is not None and torch.equal(a1._q, a2._q[:, :1])  # type: ignore[index]
    assert b1._q is None  # key b's codec was not touched
    recorder = _Recorder()
    codecs._codecs[("c", "powersgd:1")] = recorder
    codecs.get("c", "powersgd:1")
    codecs.get("c", "powersgd:1")
    assert recorder.followed == []  # the same level again: nothing to hand over
    other = codecs.get("c", "qsgd:4")
    codecs.get("c", "powersgd:1")
    assert recorder.followed == [other]
    codecs.clear()
    assert len(codecs) == 0 and codecs.get("a", "powersgd:1") is not a1

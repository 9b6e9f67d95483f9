"""`SiteStore` without sockets: the site's barrier, its sum, and its replica of the upstream."""

from __future__ import annotations

import pytest
import torch

from netsense.compression import make_codec
from netsense.errors import ProtocolError
from netsense.relay import SiteStore
from netsense.transport.wire import Params, Push, Sum

FP32 = make_codec("fp32")
SHAPES = {"a": (3, 2), "b": (4,)}


def _site(quorum: int = 1) -> SiteStore:
    site = SiteStore(local_quorum=quorum)
    site.install(Params(0, True, {k: FP32.encode(torch.zeros(s)) for k, s in SHAPES.items()}))
    return site


def _push(step: int, samples: int, fill: float, keys: tuple[str, ...] = ("a", "b"), **kw: object) -> Push:
    return Push(step, samples, len(SHAPES), {k: FP32.encode(torch.full(SHAPES[k], fill)) for k in keys}, **kw)  # type: ignore[arg-type]


def test_site_step_is_the_ps_weighted_sum() -> None:
    site = _site()
    site.join("w0")
    site.join("w1")
    g0, g1 = torch.randn(3, 2), torch.randn(3, 2)
    site.push("w0", Push(0, 3, 2, {"a": FP32.encode(g0), "b": FP32.encode(torch.ones(4))}))
    assert site.take() is None  # w1 has not pushed
    site.push("w1", Push(0, 5, 2, {"a": FP32.encode(g1), "b": FP32.encode(torch.ones(4))}))
    agg = site.take()
    assert agg is not None and agg.samples == 8 and agg.step == 0 and agg.workers == ("w0", "w1")
    assert torch.equal(agg.grads["a"], torch.mul(g0, 3 / 8).add_(g1, alpha=5 / 8))  # as the PS sums (core.py)
    assert site.version == 0 and site.in_flight == 0  # the version moves when the upstream answers


def test_bad_pushes_are_refused_whole_even_in_flight() -> None:
    site = _site()
    site.join("w0")
    for bad, code in [
        (_push(0, 4, float("nan")), "non-finite"),
        (_push(1, 4, 1.0), "stale"),
        (Push(0, 4, 2, {"a": FP32.encode(torch.zeros(2, 3))}), "shape"),
        (Push(0, 4, 7, {"a": FP32.encode(torch.zeros(3, 2))}), "keys"),
    ]:
        with pytest.raises(ProtocolError) as info:
            site.push("w0", bad)
        assert info.value.code == code
    assert not site.step_started
    site.push("w0", _push(0, 4, 1.0))
    assert site.take() is not None
    with pytest.raises(ProtocolError):
        site.push("w0", _push(0, 4, float("inf")))  # checked while the step is upstream, too
    site.push("w0", _push(0, 4, 2.0))  # a re-push of the step upstream: ignored
    assert not site.step_started and site.take() is None


def test_barrier_timeout_drops_the_silent_worker() -> None:
    site = _site(quorum=2)
    site.join("w0")
    site.join("w1")
    site.push("w0", _push(0, 4, 1.0))
    assert site.take() is None
    dropped, _ = site.drop_incomplete()
    assert dropped == ["w1"] and site.live == {"w0"}
    agg = site.take()
    assert agg is not None and agg.samples == 4 and agg.workers == ("w0",)


def test_all_skipped_is_one_skip_push() -> None:
    site = _site()
    site.join("w0")
    site.push("w0", Push(0, 4, 2, {}, skip=True))
    agg = site.take()
    assert agg is not None and agg.skip and not agg.grads


def test_install_and_pull_fan_out_the_upstream_bytes() -> None:
    site = _site()
    site.join("w0")
    site.push("w0", _push(0, 4, 1.0))
    site.take()
    delta = Params(1, False, {k: FP32.encode(torch.full(s, 0.5)) for k, s in SHAPES.items()}, base_version=0)
    applied = site.install(delta)
    assert applied is not None and applied.version == 1 and applied.workers == ("w0",) and applied.samples == 4
    assert site.pull(0) is delta  # the same update: every local replica equals the upstream's shadow
    full = site.pull(-1)
    assert full.full and torch.equal(FP32.decode(full.tensors["a"]), torch.full((3, 2), 0.5))
    with pytest.raises(ProtocolError):
        site.install(Params(3, False, delta.tensors, base_version=2))  # a delta for another base
    with pytest.raises(ProtocolError):
        site.install(Params(2, True, {"a": FP32.encode(torch.zeros(5))}))  # not the model's shapes
    with pytest.raises(ProtocolError, match="gradient-domain update before"):  # the upstream never sent its optimizer
        site.install(Params(2, False, delta.tensors, base_version=1, gradient=True))
    assert site.version == 1


def test_state_keys_split_at_the_first_push() -> None:
    """Without INIT's model map the first push names the trainable keys: the PS lists the
    parameters first, state keys after them."""
    site = SiteStore()
    site.install(Params(0, True, {"a": FP32.encode(torch.zeros(3, 2)), "b": FP32.encode(torch.zeros(4)), "n": FP32.encode(torch.zeros(1))}))
    site.join("w0")
    grads = {"a": FP32.encode(torch.ones(3, 2)), "b": FP32.encode(torch.ones(4)), "n": FP32.encode(torch.full((1,), 7.0))}
    site.push("w0", Push(0, 4, 2, grads))
    agg = site.take()
    assert agg is not None and set(agg.grads) == {"a", "b"} and torch.equal(agg.state["n"], torch.full((1,), 7.0))


def test_refused_upstream_makes_local_pulls_resync() -> None:
    site = _site()
    site.join("w0")
    site.push("w0", _push(0, 4, 1.0))
    agg = site.take()
    assert agg is not None
    site.refuse_in_flight(agg.workers, "the upstream PS refused the site's push (hparams: ...)")
    assert site.refused("w0", 0) is not None and site.in_flight is None
    site.push("w0", _push(0, 4, 1.0))  # it pushes again after its resync
    assert site.refused("w0", 0) is None and site.take() is not None


def test_init_is_checked_before_it_goes_upstream() -> None:
    site = SiteStore()
    with pytest.raises(ProtocolError):
        site.initialize({"a": FP32.encode(torch.full((2,), float("nan")))}, {"name": "sgd", "lr": 0.1})
    assert site.take_init() is None
    site.initialize({"a": FP32.encode(torch.zeros(2))}, {"name": "sgd", "lr": 0.1}, world_size=3)
    init = site.take_init()
    assert init is not None and init.world_size == 3 and not site.initialized


def test_forwarded_pushes_are_refused_at_a_relay() -> None:
    """A relay keeps none of its pushes (`Push.keeps` left out), so a PS never forwards it any
    (`Params.sums`); an upstream that does is refused before anything changes."""
    site = SiteStore(local_quorum=1)
    site.install(Params(0, True, {k: FP32.encode(torch.ones(s)) for k, s in SHAPES.items()}, optimizer={"name": "sgd", "lr": 0.5}))
    site.join("w0")
    site.push("w0", _push(0, 4, 1.0))
    assert site.take() is not None
    other = FP32.encode(torch.zeros(SHAPES["a"]))
    update = Params(1, False, {"b": FP32.encode(torch.ones(4))}, base_version=0, gradient=True, sums={"a": Sum((0.5, 0.5), 0, (other,))})
    with pytest.raises(ProtocolError) as info:
        site.install(update)
    assert info.value.code == "malformed"
    assert site.version == 0 and torch.equal(site.params["b"], torch.ones(4))

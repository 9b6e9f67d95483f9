"""ParameterStore's checkpoint state: a restored store is the one that was saved, clocks included."""

from __future__ import annotations


from netsense.compression import make_codec
from netsense.ps.store import ParameterStore
from storehelp import ssp_store as _store, push_ssp as _push

FP32 = make_codec("fp32")


def test_checkpoint_keeps_the_clocks() -> None:
    store = _store(2)
    _push(store, "fast", 0)
    fresh = ParameterStore(staleness=2)
    fresh.restore(store.state())
    assert fresh.clocks == store.clocks and fresh.version == 1

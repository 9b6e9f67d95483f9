"""When the default step is full duplex (worker/duplex.py)."""

from __future__ import annotations

import pytest

from netsense.worker.duplex import duplex_blocker


@pytest.mark.parametrize(
    ("kw", "blocked"),
    [
        ({}, None),
        ({"asynchronous": True}, "asynchronous"),
        ({"redecides": True}, "redecides"),
    ],
)
def test_the_blockers_of_the_full_duplex_default(kw: dict, blocked: str | None) -> None:
    reason = duplex_blocker(**{"asynchronous": False, "redecides": False, **kw})
    assert (reason is None) if blocked is None else (reason is not None and blocked in reason)


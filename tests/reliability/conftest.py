"""No child process of a reliability test outlives it, even when the test fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import relhelp


@pytest.fixture(autouse=True)
def _kill_children() -> Iterator[None]:
    yield
    relhelp.kill_all()

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from netsense.compression import chunks
from netsense.compression.chunks import run_chunks, scratch


@pytest.mark.parametrize(("total", "chunk"), [(0, 4), (1, 4), (10, 3), (12, 4), (1000, 7)])
def test_every_element_is_covered_once(total: int, chunk: int) -> None:
    seen = np.zeros(total, dtype=np.int64)

    def kernel(start: int, stop: int) -> None:
        assert 0 <= start < stop <= total and stop - start <= chunk
        seen[start:stop] += 1

    run_chunks(kernel, total, chunk)
    assert bool((seen == 1).all())


def test_chunks_run_on_several_threads_and_errors_reach_the_caller() -> None:
    if chunks.worker_count() < 2:
        pytest.skip("one torch thread: chunks run inline")
    names: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)

    def kernel(start: int, stop: int) -> None:
        names.add(threading.current_thread().name)
        if start < 2:
            barrier.wait()  # the first two chunks must be running at the same time

    run_chunks(kernel, 4, 1)
    assert len(names) >= 2

    def failing(start: int, stop: int) -> None:
        if start == 3:
            raise ValueError("chunk 3")

    with pytest.raises(ValueError, match="chunk 3"):
        run_chunks(failing, 6, 1)


def test_one_torch_thread_runs_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    names: set[str] = set()
    run_chunks(lambda a, b: names.add(threading.current_thread().name), 10, 1)
    assert names == {threading.current_thread().name}


def test_scratch_is_reused_per_thread_and_sized_on_demand() -> None:
    a = scratch("t", (4, 8), np.float32)
    assert a.shape == (4, 8) and a.dtype == np.float32
    b = scratch("t", (2, 8), np.float32)
    assert np.shares_memory(a, b)
    c = scratch("t", (64, 8), np.float32)
    assert c.shape == (64, 8)
    other: list[np.ndarray] = []
    t = threading.Thread(target=lambda: other.append(scratch("t", (4, 8), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], scratch("t", (4, 8), np.float32))

"""Progress efficiency q: codec priors, measurement on tensors, error feedback's sums."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from netsense.compression import ErrorFeedback, Ladder, make_codec
from netsense.compression.progress import measure_progress, progress_from_error


def test_priors_are_conservative_bounds() -> None:
    ladder = Ladder.parse("fp32,fp16,bf16,qsgd:8,qsgd:4,topk:0.1+fp16,topk:0.01+fp16,randk:0.01+fp16")
    q = {lv.spec: lv.progress for lv in ladder}
    assert q["fp32"] == 1.0 and q["fp16"] > 0.999999 and q["bf16"] > 0.9999
    assert q["qsgd:8"] == pytest.approx(1 / (1 + 512 / 255**2)) and q["qsgd:4"] == pytest.approx(1 / (1 + 512 / 15**2))
    assert q["topk:0.1+fp16"] == 0.1 and q["topk:0.01+fp16"] == 0.01 and q["randk:0.01+fp16"] == 0.01
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(50_000, generator=gen), torch.randn(200, 300, generator=gen)]
    torch.manual_seed(0)  # rand-k and qsgd draw from the global generator: one draw of rand-k fell to 0.85x its prior
    for lv in ladder:  # measured on a random tensor, every prior is a lower bound (rand-k's in expectation)
        draws = 20 if lv.spec.startswith("randk") else 1
        values = [measure_progress(make_codec(lv.spec), x) for _ in range(draws)]
        assert all(v is not None for v in values), lv.spec
        measured = sum(values) / draws  # type: ignore[arg-type]
        slack = 0.05 * lv.progress if lv.spec.startswith("randk") else 1e-6
        assert measured >= lv.progress - slack, lv.spec


def test_measure_progress_top_k_keeps_the_energy_share_of_its_entries() -> None:
    x = torch.zeros(10_000)
    x[:100] = 10.0  # 1% of the entries hold 10_000 of 10_000 + 0.01 * 9_900 energy
    x[100:] = 0.1
    q = measure_progress(make_codec("topk:0.01"), [x])
    assert q == pytest.approx(10_000 / (10_000 + 0.01 * 9_900))
    assert measure_progress(make_codec("topk:0.01"), [torch.zeros(10)]) is None
    assert progress_from_error(4.0, 1.0, unbiased=False) == 0.75
    assert progress_from_error(4.0, 1.0, unbiased=True) == 0.8
    assert progress_from_error(1.0, 4.0, unbiased=False) == 0.0


def test_measure_progress_subsamples_large_tensors() -> None:
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(4_000_000, generator=gen)
    whole = measure_progress(make_codec("topk:0.01"), [big], max_numel=big.numel())
    sampled = measure_progress(make_codec("topk:0.01"), [big], max_numel=1 << 16)
    assert whole is not None and sampled is not None and sampled == pytest.approx(whole, rel=0.15)
    matrix = measure_progress(make_codec("topk:0.01"), [torch.randn(4000, 1000, generator=gen)], max_numel=1 << 16)
    assert matrix is not None and matrix == pytest.approx(whole, rel=0.15)


def test_error_feedback_reports_the_share_it_sent() -> None:
    ef = ErrorFeedback()
    codec = make_codec("topk:0.25")  # one entry of four, one of two
    ef.compress("a", torch.tensor([4.0, 3.0, 0.0, 0.0]), codec)
    ef.compress("b", torch.tensor([1.0, 0.0]), codec)
    assert ef.pop_progress() == pytest.approx(1 - 9 / 26)  # energy 25 + 1, residual 9 (the 3.0)
    assert ef.pop_progress() is None  # sums were reset
    ef.compress("a", torch.tensor([0.0, 0.0, 0.0, 1.0]), codec)  # v = [0, 3, 0, 1]: 3 sent, 1 kept
    assert ef.pop_progress() == pytest.approx(1 - 1 / 10)
    ef.compress("a", torch.ones(4), make_codec("fp32"))  # lossless: flushes, adds nothing to the sums
    assert ef.pop_progress() is None


def test_measure_level_times_tiny_strided_subsamples() -> None:
    """A warm-up sample of 64 elements over six keys leaves one-element slices with stride 16, which
    `contiguous()` keeps and fp16's byte view rejected; the measurement copies them dense."""
    from netsense.compression.progress import measure_level

    gen = torch.Generator().manual_seed(0)
    keys = [torch.randn(s, generator=gen) for s in ((32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (10, 1600), (10,))]
    for spec in ("fp16", "qsgd:8", "topk:0.1+fp16"):
        sample = measure_level(make_codec(spec), keys, max_numel=64)
        assert sample is not None and sample.progress is not None
        assert sample.encode_s >= 0 and sample.decode_s >= 0 and 0 < sample.dense_bytes < 4 * sum(k.numel() for k in keys)


def test_sender_encode_includes_error_feedbacks_decode_for_lossy_levels() -> None:
    from netsense.compression.progress import LevelSample, sender_encode_s

    sample = LevelSample(progress=0.9, encode_s=0.004, decode_s=0.001, dense_bytes=4000)
    assert sender_encode_s(make_codec("qsgd:8"), sample) == pytest.approx(0.005)
    assert sender_encode_s(make_codec("fp32"), sample) == 0.004


@contextmanager
def gil_hog(threads: int = 1) -> Iterator[None]:
    """A thread spinning in pure Python beside the test (as a busy event loop sits beside the PS's
    window thread), on `threads` intra-op torch threads in the test's own thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    hog = threading.Thread(target=spin, daemon=True)
    hog.start()
    try:
        yield
    finally:
        stop.set()
        hog.join()
        torch.set_num_threads(before)


def test_candidate_timings_leave_out_the_gil_waits_of_a_busy_thread() -> None:
    """Each torch kernel releases the GIL, and getting it back from a thread busy in Python takes
    up to a switch interval (5 ms): wall time priced a round on the PS's window thread 2-4x over
    its work. On one intra-op thread a codec is timed on this thread's CPU time, which can only be
    a part of what the thread spent during the whole measurement."""
    from netsense.compression.progress import codec_clock, measure_level

    keys = [torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) for _ in range(3)]
    codec = make_codec("powersgd:2")
    measure_level(codec, keys)  # lazy set-up outside the hog
    timed = 0.0
    with gil_hog():
        assert codec_clock() is time.thread_time
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        for _ in range(10):  # a few rounds: the hog takes its first turn only after a switch interval
            sample = measure_level(codec, keys)
            assert sample is not None
            timed += sample.encode_s + sample.decode_s
            if time.perf_counter() - wall0 > 0.5:
                break
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert timed <= cpu, (timed, cpu, wall)  # wall-clock codec times: 0.07-3 s timed for 0.01-0.1 s of CPU
    with gil_hog(threads=2):
        assert codec_clock() is time.perf_counter  # other intra-op threads' work: thread_time misses it


def test_codecs_on_a_gpu_are_timed_on_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA kernel runs on the device, where the thread's CPU time does not look."""
    from netsense.compression.progress import codec_clock

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert codec_clock() is time.thread_time
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert codec_clock() is time.perf_counter


def test_low_rank_levels_are_measured_on_whole_keys_from_a_fresh_basis() -> None:
    """A rank-r fit to a row subsample keeps far more of a matrix than the fit to the matrix, and a
    basis left by another key is no warm start: low-rank candidates see whole keys, each cold."""
    from netsense.compression.progress import measure_level

    gen = torch.Generator().manual_seed(0)
    keys = [torch.randn(512, 256, generator=gen), torch.randn(512, 256, generator=gen), torch.randn(256, generator=gen)]

    def fresh(spec: str) -> float:  # one fresh codec per key, on the whole key
        energy = error = 0.0
        for k in keys:
            c = make_codec(spec)
            e = k - c.decode(c.encode(k)).float()
            energy, error = energy + float((k * k).sum()), error + float((e * e).sum())
        return 1 - error / energy

    for spec in ("powersgd:1", "powersgd:4"):
        codec = make_codec(spec)
        flattered = measure_level(make_codec(spec), keys, max_numel=4096, whole_keys=False)
        whole = measure_level(codec, keys, max_numel=4096)
        again = measure_level(codec, keys, max_numel=4096)  # the basis of the last key is not reused
        assert flattered is not None and whole is not None and again is not None
        assert whole.progress is not None and flattered.progress is not None and again.progress is not None
        assert whole.dense_bytes == 4 * sum(k.numel() for k in keys)
        assert flattered.progress > whole.progress + 0.05, spec
        assert whole.progress == pytest.approx(fresh(spec), abs=0.02) and again.progress == pytest.approx(fresh(spec), abs=0.02)


def test_measure_level_weighs_both_energies_by_the_metric() -> None:
    """In a diagonal metric (`weights`) an error on a heavy coordinate costs more, and a share of
    the energy there is worth more: q = 1 - sum w e^2 / sum w x^2, subsampled at the same positions."""
    from netsense.compression.progress import measure_level

    x = torch.tensor([2.0, 1.0, 0.0, 0.0])  # top-1 keeps the 2 and drops the 1
    plain = measure_level(make_codec("topk:0.25"), [x])
    heavy = measure_level(make_codec("topk:0.25"), [x], weights=[torch.tensor([1.0, 4.0, 1.0, 1.0])])
    assert plain is not None and heavy is not None
    assert plain.progress == pytest.approx(1 - 1 / 5) and heavy.progress == pytest.approx(1 - 4 / 8)
    gen = torch.Generator().manual_seed(3)
    big = torch.randn(300_000, generator=gen).abs()  # subsampled: the weights must follow the same positions
    flat = measure_level(make_codec("topk:0.5"), [big], max_numel=1 << 12)
    ones = measure_level(make_codec("topk:0.5"), [big], max_numel=1 << 12, weights=[torch.ones_like(big)])
    on_small = measure_level(make_codec("topk:0.5"), [big], max_numel=1 << 12, weights=[1.0 / big])
    assert flat is not None and ones is not None and on_small is not None
    assert ones.progress == pytest.approx(flat.progress)
    assert on_small.progress is not None and flat.progress is not None and on_small.progress < flat.progress - 0.1
    with pytest.raises(ValueError, match="one weight tensor per tensor"):
        measure_level(make_codec("topk:0.5"), [x], weights=[torch.ones(3)])

"""A relay in front of the PS changes no bit of training, and halves what crosses the WAN."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from netsense.transport.tls import CertPaths

from .relayhelp import MODEL_BYTES, Worker, connect, digits, params_of, relay, run_workers, start_ps

STEPS = 6


def _direct(
    certs: CertPaths, world: int, spread: int = 4, hook: Any = None, domain: str = "auto", **options: Any
) -> tuple[dict[str, torch.Tensor], list[Worker]]:
    ps = start_ps(certs, downlink_domain=domain)
    try:
        here = connect(certs, ps.port)
        workers = [Worker(r, world, here, STEPS, digits(), spread=spread, hook=hook, options=options) for r in range(world)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        return params_of(ps), workers
    finally:
        ps.stop()


@pytest.mark.parametrize(
    "options", [{}, {"codec": "fp16"}, {"overlap": True}], ids=["fp32", "fp16-uplink", "overlap-pipelined"]
)
def test_relay_of_two_workers_is_bit_exact(certs: CertPaths, options: dict[str, Any]) -> None:
    """Two workers behind one relay vs the same two workers on the PS: every parameter equal bit
    for bit (the relay decodes and sums as the PS does, the PS then weights the site's mean by
    1.0), and every replica equals the PS. The workers' own codec (fp16) is decoded at the relay as
    the PS would; pipelined pulls (overlap) are answered from the whole upstream update.

    Equal batches: the weights (1/2) are powers of two, so each product is exact and the sum does
    not depend on which push came first. With unequal ones the PS itself depends on arrival order
    (it rounds the first product, then adds the second with a fused multiply-add), which no two
    runs share: `test_unequal_batches_weight_by_samples` compares those to rounding.

    A lossy uplink in the parameter domain: in the gradient domain the update goes down at the
    codec it was pushed in, the workers' fp16 directly and the relay's own codec through it."""
    domain = "params" if options.get("codec") else "auto"
    reference, _ = _direct(certs, 2, spread=0, domain=domain, **options)
    ps = start_ps(certs, downlink_domain=domain)
    site = relay(certs, ps.port, site_workers=2)
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits(), spread=0, options=options) for r in range(2)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        got = params_of(ps)
        assert ps.call(lambda: sorted(ps.server.sessions)) == ["relay-a"]  # the PS saw one worker
        phases = site.net.run(_phases(site))
    finally:
        site.stop()
        ps.stop()
    # every site step timed: its push and the wait for its update; gather from the second on
    assert phases["steps"] == STEPS and phases["push_s"] > 0 and phases["update_s"] >= 0, phases
    assert phases["gather_s"] > 0 and phases["install_s"] >= 0, phases
    assert got.keys() == reference.keys()
    for key in reference:
        assert torch.equal(got[key], reference[key]), key
    for w in workers:
        for (name, p), key in zip(w.model.named_parameters(), reference):
            assert torch.equal(p.detach(), got[key]), name


async def _phases(site: Any) -> dict[str, float | int]:
    """The relay's step phases of its one upstream shard, read on its loop."""
    (phases,) = site.relay.phases()
    assert phases is not None
    return phases


def _slow_down(w: Worker) -> None:
    """A schedule: lr 0.2 (INIT's) for two steps, then 0.05, sent with each push."""
    assert w.opt is not None
    if w.opt.version == 2:
        w.opt.param_groups[0]["lr"] = 0.05


def test_per_step_hyper_parameters_pass_through(certs: CertPaths) -> None:
    """The workers' per-step lr reaches the PS through the relay (bit for bit, equal batches): a
    relay that dropped it would leave the PS at INIT's lr."""
    reference, _ = _direct(certs, 2, spread=0, hook=_slow_down)
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2)
    try:
        here = connect(certs, site.ports[0])
        run_workers([Worker(r, 2, here, STEPS, digits(), spread=0, hook=_slow_down) for r in range(2)])
        got = params_of(ps)
    finally:
        site.stop()
        ps.stop()
    for key in reference:
        assert torch.equal(got[key], reference[key]), key


def test_unequal_batches_weight_by_samples(certs: CertPaths) -> None:
    """Batches of 16 and 20 samples behind one relay: the site's gradient is their sample-weighted
    mean (a plain mean of the two fails this, and the test beside a direct worker)."""
    reference, _ = _direct(certs, 2)
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2)
    try:
        run_workers([Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)])
        got = params_of(ps)
    finally:
        site.stop()
        ps.stop()
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=1e-5, atol=1e-6)


def test_relay_beside_a_direct_worker(certs: CertPaths) -> None:
    """Two workers behind a relay + one direct vs three direct. The PS sums the three direct
    gradients in arrival order; with the relay it sums the site's mean and the third, so float
    rounding may differ by an ulp per step: the tolerance of tests/e2e/test_sync_exact.py."""
    reference, _ = _direct(certs, 3)
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2)
    try:
        workers = [Worker(r, 3, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]
        seen: list[list[str]] = []
        watch = lambda w: seen.append(ps.call(lambda: sorted(ps.server.sessions)))  # noqa: E731
        workers.append(Worker(2, 3, connect(certs, ps.port), STEPS, digits(), hook=watch))
        run_workers(workers)
        got = params_of(ps)
        assert seen[0] == ["relay-a", "w2"]  # the PS sees the site as one worker
    finally:
        site.stop()
        ps.stop()
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=1e-5, atol=1e-6)
    for w in workers:  # every replica, behind the relay or not, equals the PS
        for p, key in zip(w.model.parameters(), reference):
            assert torch.equal(p.detach(), got[key])


def test_wan_bytes_scale_with_sites(certs: CertPaths) -> None:
    """Per step the relay's upstream connection carries about one model each way, half of what
    two direct workers move (read from the connection counters, steps 2..STEPS)."""
    marks: dict[str, tuple[int, int]] = {}

    def direct() -> float:
        ps = start_ps(certs)
        try:
            workers = [Worker(r, 2, connect(certs, ps.port), STEPS, digits()) for r in range(2)]

            def hook(w: Worker) -> None:
                assert w.opt is not None
                marks[f"d{w.rank}-{w.opt.version}"] = w.opt._exchange.traffic()

            for w in workers:
                w.hook = hook
            run_workers(workers)
            return sum(marks[f"d{r}-{STEPS}"][0] - marks[f"d{r}-2"][0] for r in range(2)) / (STEPS - 2)
        finally:
            ps.stop()

    direct_up = direct()
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2)
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]

        def hook(w: Worker) -> None:
            assert w.opt is not None
            if w.rank == 0:
                marks[f"r-{w.opt.version}"] = site.wan_bytes()

        for w in workers:
            w.hook = hook
        run_workers(workers)
    finally:
        site.stop()
        ps.stop()
    sent = (marks[f"r-{STEPS}"][0] - marks["r-2"][0]) / (STEPS - 2)
    received = (marks[f"r-{STEPS}"][1] - marks["r-2"][1]) / (STEPS - 2)
    print(f"per step: relay up {sent:.0f} B, down {received:.0f} B; two direct workers up {direct_up:.0f} B; model {MODEL_BYTES} B")
    assert 0.9 * MODEL_BYTES < sent < 1.3 * MODEL_BYTES
    assert 0.9 * MODEL_BYTES < received < 1.3 * MODEL_BYTES
    assert sent < 0.6 * direct_up


def test_lossy_upstream_codec_halves_the_wan_bytes(certs: CertPaths) -> None:
    """`upstream_codec="fp16"`: the site's push is half the model, error feedback at the relay
    keeps training on course (parameters near the fp32 job's; fp16 rounding is not exact)."""
    reference, _ = _direct(certs, 2)
    marks: dict[int, tuple[int, int]] = {}
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2, upstream_codec="fp16")
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]

        def hook(w: Worker) -> None:
            if w.rank == 0 and w.opt is not None:
                marks[w.opt.version] = site.wan_bytes()

        workers[0].hook = hook
        run_workers(workers)
        got = params_of(ps)
    finally:
        site.stop()
        ps.stop()
    sent = (marks[STEPS][0] - marks[2][0]) / (STEPS - 2)
    assert 0.4 * MODEL_BYTES < sent < 0.7 * MODEL_BYTES
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=0, atol=1e-2)


def test_two_sites_of_two_workers(certs: CertPaths) -> None:
    """2 relays x 2 workers vs 4 direct workers: the PS sees two workers, the parameters agree to
    rounding (the PS sums two site means where it summed four gradients), every replica equals
    the PS, and each relay moves about one model each way per step."""
    reference, _ = _direct(certs, 4)
    ps = start_ps(certs)
    sites = [relay(certs, ps.port, site="a", site_workers=2), relay(certs, ps.port, site="b", site_workers=2)]
    marks: dict[tuple[int, int], tuple[int, int]] = {}
    seen: list[list[str]] = []

    def hook(w: Worker) -> None:
        assert w.opt is not None
        if w.rank in (0, 2):
            marks[(w.rank // 2, w.opt.version)] = sites[w.rank // 2].wan_bytes()
        if w.rank == 0 and w.opt.version == 1:
            seen.append(ps.call(lambda: sorted(ps.server.sessions)))

    try:
        workers = [Worker(r, 4, connect(certs, sites[r // 2].ports[0]), STEPS, digits(), hook=hook) for r in range(4)]
        run_workers(workers)
        got = params_of(ps)
    finally:
        for s in sites:
            s.stop()
        ps.stop()
    assert seen == [["relay-a", "relay-b"]]
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=1e-5, atol=1e-6)
    for w in workers:
        for p, key in zip(w.model.parameters(), reference):
            assert torch.equal(p.detach(), got[key])
    for s in range(2):
        sent = (marks[(s, STEPS)][0] - marks[(s, 2)][0]) / (STEPS - 2)
        assert 0.9 * MODEL_BYTES < sent < 1.3 * MODEL_BYTES

"""A relay in front of the PS changes no bit of training, and halves what crosses the WAN."""

from __future__ import annotations

import torch

from netsense.transport.tls import CertPaths

from .relayhelp import MODEL_BYTES, Worker, connect, digits, params_of, relay, run_workers, start_ps

STEPS = 6


def _direct(certs: CertPaths, world: int) -> tuple[dict[str, torch.Tensor], list[Worker]]:
    ps = start_ps(certs)
    try:
        workers = [Worker(r, world, connect(certs, ps.port), STEPS, digits()) for r in range(world)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        return params_of(ps), workers
    finally:
        ps.stop()


def test_relay_of_two_workers_is_bit_exact(certs: CertPaths) -> None:
    """Two workers behind one relay vs the same two workers on the PS: every parameter equal bit
    for bit (the relay sums in the PS's order, the PS then weights the site's mean by 1.0), and
    every replica equals the PS."""
    reference, _ = _direct(certs, 2)
    ps = start_ps(certs)
    site = relay(certs, ps.port, site_workers=2)
    try:
        workers = [Worker(r, 2, connect(certs, site.ports[0]), STEPS, digits()) for r in range(2)]
        run_workers(workers)
        assert ps.call(lambda: ps.server.store.version) == STEPS
        got = params_of(ps)
        assert ps.call(lambda: sorted(ps.server.sessions)) == ["relay-a"]  # the PS saw one worker
    finally:
        site.stop()
        ps.stop()
    assert got.keys() == reference.keys()
    for key in reference:
        assert torch.equal(got[key], reference[key]), key
    for w in workers:
        for (name, p), key in zip(w.model.named_parameters(), reference):
            assert torch.equal(p.detach(), got[key]), name


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
        workers.append(Worker(2, 3, connect(certs, ps.port), STEPS, digits(), hook=lambda w: seen.append(ps.call(lambda: sorted(ps.server.sessions)))))
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

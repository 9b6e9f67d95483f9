"""Full duplex (overlap + pipelined push/pull) gives bit for bit the parameters of the plain
synchronous step: same seeds, same batches, sync PS, one PS or two shards, fp32 and fp16 pushes.

This is what makes it the default (docs/ARCHITECTURE.md, "Overlap"): a test that compares with a
tolerance would not notice a step pulled one version late, so the comparison here is `torch.equal`,
and `test_a_stale_pull_is_caught` (the parameter domain) and `test_a_stale_gradient_pull_is_caught`
(the gradient domain, the default) show it catches one."""

from __future__ import annotations

import threading

import pytest
import torch

from netsense.ps.server import ServerSettings
from netsense.ps.store.encode import UpdateEncoder
from netsense.ps.store.gradient import GradientDownlink
from netsense.worker.optimizer import NetSenseOptimizer

from ..conftest import start_ps, stop_ps

STEPS = 5
OPTIMIZER = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = 4 + rank
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train(certs, shards: int, overlap: bool, codec: str, sites: tuple[str, str] | None = None, domain: str = "auto") -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:  # type: ignore[no-untyped-def]
    """Two workers, `STEPS` steps on fresh PS shards; (the PS's parameters, each replica's).
    `sites`: shard i and worker i at sites[i] (WAN-first release on)."""
    servers = [start_ps(certs, ServerSettings(port=0, downlink_domain=domain), site=sites[i] if sites else None) for i in range(shards)]
    models = [_model(), _model()]
    opts: list[NetSenseOptimizer | None] = [None, None]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            opt = opts[rank] = NetSenseOptimizer(
                models[rank], connect=[ps.connect_settings(site=sites[rank] if sites else "") for ps in servers], rank=rank, world_size=2,
                worker_id=f"w{rank}", optimizer=OPTIMIZER, codec=codec, bucket_bytes=512,
                overlap=overlap, overlap_bucket_bytes=512,
            )  # fmt: skip
            for step in range(STEPS):
                x, y = _batch(step, rank)
                opt.zero_grad(samples=len(x))
                torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                opt.step(samples=len(x))
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        seen = [ps.call(lambda ps=ps: {w: s.site for w, s in ps.server.sessions.items()}) for ps in servers]
        for o in opts:
            if o is not None:
                o.close()
        assert not errors, errors
        assert all(ps.server.store.version == STEPS for ps in servers)
        if sites:  # each PS knew where each worker is, so it answered the far one first
            assert seen == [{"w0": sites[0], "w1": sites[1]}] * shards and all(ps.server.release.enabled for ps in servers)
        params = {k: v.clone() for ps in servers for k, v in ps.server.store.params.items()}
    finally:
        for ps in servers:
            stop_ps(ps)
    return params, [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]


def _mismatches(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Keys whose tensors differ in any bit."""
    return sorted(k for k in a if k not in b or not torch.equal(a[k], b[k]))


@pytest.mark.parametrize("shards", [1, 2], ids=["one-ps", "two-shards"])
@pytest.mark.parametrize("codec", ["fp32", "fp16"])
def test_full_duplex_equals_the_plain_step_bit_for_bit(certs, shards: int, codec: str) -> None:  # type: ignore[no-untyped-def]
    plain, plain_replicas = _train(certs, shards, overlap=False, codec=codec)
    duplex, duplex_replicas = _train(certs, shards, overlap=True, codec=codec)
    assert _mismatches(duplex, plain) == []
    for replica in plain_replicas + duplex_replicas:  # every replica holds the PS's parameters
        assert _mismatches(replica, plain) == []


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "duplex"])
def test_wan_first_release_keeps_the_step_exact(certs, overlap: bool) -> None:  # type: ignore[no-untyped-def]
    """Two sites, a shard and a worker at each: the PS holds its own site's pulls (ps/release.py),
    which changes when, never what, a worker gets."""
    plain, _ = _train(certs, 2, overlap=False, codec="fp32")
    sited, replicas = _train(certs, 2, overlap=overlap, codec="fp32", sites=("a", "b"))
    assert _mismatches(sited, plain) == []
    for replica in replicas:
        assert _mismatches(replica, plain) == []


def test_a_stale_pull_is_caught(certs, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A PS whose keyed pulls send a key's value from before the update (its shadow advances as
    usual): the replicas compute on stale parameters, and the bit-for-bit comparison says so.
    The parameter domain's encoder is the one made stale."""
    plain, _ = _train(certs, 1, overlap=False, codec="fp32", domain="params")
    fresh = UpdateEncoder.encode_key

    def stale(self, key, param, spec):  # type: ignore[no-untyped-def]
        payload, value = fresh(self, key, self.shadow[key], spec)  # the version before this update
        return payload, fresh(self, key, param, spec)[1]

    monkeypatch.setattr(UpdateEncoder, "encode_key", stale)
    duplex, replicas = _train(certs, 1, overlap=True, codec="fp32", domain="params")
    assert _mismatches(duplex, plain) != []
    assert _mismatches(replicas[0], duplex) != []


def test_a_stale_gradient_pull_is_caught(certs, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The gradient domain's keyed pulls (the default domain): a PS that sends a key applied ahead
    at the previous step's payload leaves the replicas behind its parameters, and the bit-for-bit
    comparison says so."""
    plain, _ = _train(certs, 1, overlap=False, codec="fp16")
    fresh = GradientDownlink.payload
    last: dict[str, object] = {}

    def stale(self, key):  # type: ignore[no-untyped-def]
        now = fresh(self, key)
        before = last.get(key, now)
        last[key] = now
        return before

    monkeypatch.setattr(GradientDownlink, "payload", stale)
    duplex, replicas = _train(certs, 1, overlap=True, codec="fp16")
    assert last, "the keyed pulls went through GradientDownlink.payload"
    assert _mismatches(replicas[0], duplex) != [] or _mismatches(duplex, plain) != []


class _WithBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize(
    ("case", "duplex"),
    [("sync", True), ("async", False), ("buffers", True), ("netsense-policy", False), ("fp16-policy", True)],
)
def test_the_default_is_full_duplex_where_exact(certs, case: str, duplex: bool) -> None:  # type: ignore[no-untyped-def]
    """``overlap=None`` (the training loop's default): on against a sync PS, model buffers included
    (they ride with the hook pushes: tests/e2e/test_buffers.py), off where the result or the
    behaviour would differ (worker/duplex.py); ``overlap=False`` stays off everywhere."""
    from netsense.ps.server import ServerSettings

    ps = start_ps(certs, ServerSettings(port=0, staleness=1) if case == "async" else None)
    try:
        model = _WithBuffer() if case == "buffers" else _model()
        policy = {"netsense-policy": "netsense", "fp16-policy": "fp16"}.get(case)
        with NetSenseOptimizer(model, connect=ps.connect_settings(), overlap=None, policy=policy) as opt:
            assert opt.overlap is duplex and (opt.duplex_off is None) is duplex and bool(opt._hooks) is duplex
            x, y = _batch(0, 0)
            opt.zero_grad(samples=len(x))
            torch.nn.functional.cross_entropy(model(x), y).backward()
            assert (opt.step(samples=len(x)).early_buckets > 0) is duplex
        with NetSenseOptimizer(model, connect=ps.connect_settings(), overlap=False, policy=policy) as opt:
            assert opt.overlap is False and not opt._hooks
    finally:
        stop_ps(ps)


@pytest.mark.parametrize(("bucket_bytes", "stays"), [(1 << 20, False), (256, True)], ids=["one-bucket", "several-buckets"])
def test_the_default_drops_the_hooks_when_a_step_is_one_bucket(certs, bucket_bytes: int, stays: bool) -> None:  # type: ignore[no-untyped-def]
    """A step that fits in one hook bucket per shard has nothing to pipeline (its push leaves when
    backward ends, its pull waits for all of it), so after its first step the default goes plain."""
    ps = start_ps(certs)
    try:
        model = _model()
        with NetSenseOptimizer(model, connect=ps.connect_settings(), overlap=None, overlap_bucket_bytes=bucket_bytes) as opt:
            early = []
            for step in range(3):
                x, y = _batch(step, 0)
                opt.zero_grad(samples=len(x))
                torch.nn.functional.cross_entropy(model(x), y).backward()
                early.append(opt.step(samples=len(x)).early_buckets)
            assert early[0] > 0 and (all(n > 0 for n in early) if stays else early[1:] == [0, 0])
            assert opt.overlap is stays and (opt.duplex_off is None) is stays and bool(opt._hooks) is stays
            assert opt.version == 3
    finally:
        stop_ps(ps)

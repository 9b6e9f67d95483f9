"""How a candidate round prices low-rank levels, against what the level sent measures itself
(docs/history/BENCHMARKS-2026.md, "What a level costs in steps"). Not a test: one process plays the PS and its
workers (SGD with momentum 0.9, lr 0.05, batch 64) with the downlink sent at `--sent` under error
feedback (one warm codec per key, as `UpdateEncoder` sends it). Every 10 updates it prints the sent
level's own one-update q and every candidate's q measured on the same update v = params - shadow:

    subsample   `measure_level` on the 2^16-element row subsample, one codec kept across rounds
                (the rounds until 2026-12-03)
    whole       `measure_level` as it is now: whole keys, each from a fresh basis
    whole+1     whole keys after one extra power iteration on the same key (a warm start that
                knew the update in advance: an upper bound)

    .venv/bin/python scripts/candidate_q.py [--model wide-mlp] [--sent powersgd:4] [--updates 60]
"""

from __future__ import annotations

import argparse

import torch

from netsense.compression import make_codec
from netsense.compression.progress import measure_level, progress_from_error
from netsense.models import load_task

CANDIDATES = ("powersgd:1", "powersgd:2", "powersgd:4", "qsgd:4")


def warm_plus_one(spec: str, keys: list[torch.Tensor]) -> float:
    """q with one extra power iteration on each key first (fresh codec per key)."""
    energy = error = 0.0
    unbiased = False
    for key in keys:
        codec = make_codec(spec)
        codec.encode(key)
        err = key - codec.roundtrip(key).float()
        energy, error = energy + float((key * key).sum()), error + float((err * err).sum())
        unbiased = codec.unbiased
    return progress_from_error(energy, error, unbiased=unbiased)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="wide-mlp")
    p.add_argument("--sent", default="powersgd:4")
    p.add_argument("--updates", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    task = load_task(args.model)
    net = task.build_model()
    assert task.train_inputs is not None and task.train_targets is not None
    params = {k: t.detach().clone() for k, t in net.named_parameters()}
    shadow = {k: t.clone() for k, t in params.items()}
    momentum = {k: torch.zeros_like(t) for k, t in params.items()}
    sent = {k: make_codec(args.sent) for k in params}
    sent_unbiased = make_codec(args.sent).unbiased
    kept = {spec: make_codec(spec) for spec in CANDIDATES}  # the old rounds' codecs, one per level
    gen = torch.Generator().manual_seed(args.seed)
    for t in range(args.updates):
        with torch.no_grad():
            for k, param in net.named_parameters():
                param.copy_(shadow[k])  # the workers' gradients are taken at the replica
        idx = torch.randint(0, len(task.train_inputs), (64,), generator=gen)
        net.zero_grad()
        task.loss(net(task.train_inputs[idx]), task.train_targets[idx]).backward()
        for k, param in net.named_parameters():
            assert param.grad is not None
            momentum[k].mul_(0.9).add_(param.grad)
            params[k] -= 0.05 * momentum[k]
        update = [params[k] - shadow[k] for k in params]
        energy = error = 0.0
        for k, v in zip(params, update):
            shadow[k] += sent[k].roundtrip(v).float()
            err = params[k] - shadow[k]
            energy, error = energy + float((v * v).sum()), error + float((err * err).sum())
        if t % 10 == 0:
            cells = []
            for spec in CANDIDATES:
                old = measure_level(kept[spec], update, whole_keys=False)
                now = measure_level(make_codec(spec), update)
                assert old is not None and now is not None
                cells.append(f"{spec} {old.progress:.3f}/{now.progress:.3f}/{warm_plus_one(spec, update):.3f}")
            print(f"update {t:3d}  sent {args.sent} q {progress_from_error(energy, error, unbiased=sent_unbiased):.3f} | " + " | ".join(cells))
    print("candidate cells: subsample / whole / whole+1")


if __name__ == "__main__":
    main()

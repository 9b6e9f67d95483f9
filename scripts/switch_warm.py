"""What a PowerSGD level loses on the step it is resumed after another rank ran (docs/POLICIES.md,
"Switching levels"): the relative error |g - C(g)|^2 / |g|^2 of that step on a model's own
gradients, with the level's own stale basis, with the other rank's (`Codec.follow`), and for a
level that ran throughout.

One process trains the model with plain SGD on its own batches; every `--every` steps (from
`--every`) each of ranks `--ranks` is measured on that step's gradient after the `--held` rank ran
alone since the previous measurement (the resumed level last ran then). Keys that travel dense at a
rank are left out. Prints one line per (rank, basis) with the error at each measurement and the mean.

    .venv/bin/python scripts/switch_warm.py --model digits-cnn
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from netsense.compression import make_codec
from netsense.compression.lowrank import PowerSGD, factor_dims
from netsense.models import load_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="digits-cnn")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--held", type=int, default=2, help="the rank sent between measurements")
    p.add_argument("--ranks", default="1,4", help="the ranks resumed")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = load_task(args.model)
    model = task.build_model()
    inputs, targets = task.train_inputs, task.train_targets
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ranks = [int(r) for r in args.ranks.split(",")]
    keys = [n for n, q in model.named_parameters() if factor_dims(tuple(q.shape), max(ranks + [args.held]))]

    def codecs(rank: int) -> dict[str, PowerSGD]:
        out = {}
        for n in keys:
            codec = make_codec(f"powersgd:{rank}")
            assert isinstance(codec, PowerSGD)
            out[n] = codec
        return out

    held, throughout = codecs(args.held), {r: codecs(r) for r in ranks}
    # Run only at the measurements: as before `follow` (own basis) and as now (the held rank's).
    resumed = {basis: {r: codecs(r) for r in ranks} for basis in ("own stale", "followed")}
    gen = torch.Generator().manual_seed(args.seed + 1)
    errors: dict[tuple[int, str], list[float]] = {}
    for step in range(args.steps):
        idx = torch.randint(0, len(inputs), (task.batch_size,), generator=gen)
        opt.zero_grad()
        task.loss(model(inputs[idx]), targets[idx]).backward()
        grads = {n: q.grad.detach().clone() for n, q in model.named_parameters() if n in keys}
        measure = step >= args.every and step % args.every == 0
        for r in ranks:
            if measure:
                for basis in ("own stale", "followed", "throughout"):
                    err = energy = 0.0
                    for n, g in grads.items():
                        if basis == "throughout":
                            codec = copy.deepcopy(throughout[r][n])
                        else:  # the resumed level goes out this step
                            codec = resumed[basis][r][n]
                            if basis == "followed":
                                codec.follow(held[n])
                        err += float((g - codec.roundtrip(g)).square().sum())
                        energy += float(g.square().sum())
                    errors.setdefault((r, basis), []).append(err / energy)
            for n, g in grads.items():
                throughout[r][n].roundtrip(g)
        for n, g in grads.items():
            held[n].roundtrip(g)
        opt.step()
    print(f"{args.model}: rank {args.held} held, error of the resumed rank's step at steps {args.every}, {2 * args.every}, ...")
    for (r, basis), errs in sorted(errors.items()):
        print(f"  rank {r} {basis:10s} mean {statistics.mean(errs):.3f}  " + " ".join(f"{e:.3f}" for e in errs))


if __name__ == "__main__":
    main()

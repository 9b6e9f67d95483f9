"""`netsense export`: a PS checkpoint as the plain `state_dict` that `model.load_state_dict` takes.

PS checkpoints carry a header and a digest (ps/checkpoint.py), so `torch.load` does not read them;
this writes the model's parameters and buffers, under their module names, with `torch.save`.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from netsense.ps import checkpoint

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="write a PS checkpoint as a plain state_dict",
        description="Read the newest valid checkpoint of every PS shard of a job and write the model's "
        "parameters and buffers as a plain state_dict: model.load_state_dict(torch.load(OUT)) loads it.",
        epilog="Examples:\n  netsense export --checkpoint-dir ckpt --out model.pt\n"
        "  netsense export --checkpoint-dir ckpt   # ckpt/shard-0, ckpt/shard-1, ... of `launch --servers 2`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint-dir", required=True, metavar="DIR", help="the PS checkpoint folder, or the folder of its shard-i folders")
    p.add_argument("--out", default="model.pt", metavar="PATH", help="where to write the state_dict (default model.pt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    states, versions = [], []
    for d in checkpoint.shard_dirs(args.checkpoint_dir):
        state, path = checkpoint.load_latest(d)
        states.append(state)
        versions.append(int(state["version"]))
        log.info("read %s (version %d)", path, state["version"])
    if len(set(versions)) > 1:
        log.warning("the shards' newest checkpoints are of different versions %s: the export mixes them", versions)
    state_dict = checkpoint.export_state_dict(states)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state_dict, out)
    job = str(states[0].get("job_id", ""))
    print(json.dumps({"out": str(out), "entries": len(state_dict), "versions": versions, "job_id": job}))
    return 0

"""A synthetic 8-layer MLP (2.1M parameters, 4.2 MB of fp16 gradient) whose CPU step at batch 4096
takes about as long as its fp16 push over 50 Mbit/s: the regime where overlap can pay.

    netsense launch --model examples.overlap_mlp:task --workers 1 --steps 10 \\
        --eval-every 0 --link rate=50mbit,delay=5ms --codec fp16 --downlink-codec fp16 [--overlap]
"""

from __future__ import annotations

import torch

from netsense.worker.task import TrainTask


def _model() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))


def task() -> TrainTask:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 512, generator=g)
    y = torch.randint(0, 10, (8192,), generator=g)
    return TrainTask(
        name="overlap-mlp",
        build_model=_model,
        train_inputs=x,
        train_targets=y,
        test_inputs=x[:256],
        test_targets=y[:256],
        batch_size=4096,
        optimizer={"name": "sgd", "lr": 0.01},
        steps=10,
    )

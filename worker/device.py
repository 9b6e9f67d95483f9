"""Where a worker computes: the device setting, checked before any process trains.

Two checks at two times. `parse_device` is syntax only (config validation: a config written on a
laptop for a GPU machine must still load). `resolve_device` runs where the worker will train and
fails at start with a message naming the problem, not with a CUDA error deep in the first step.
"""

from __future__ import annotations

import torch

from netsense.errors import ConfigError

DEVICE_TYPES = ("cpu", "cuda")
"""Device types a worker may train on."""


def parse_device(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a `torch.device`; ValueError for anything else."""
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {spec!r}: not a device; use cpu, cuda or cuda:N") from exc
    if device.type not in DEVICE_TYPES:
        raise ValueError(f"device {spec!r}: only {' and '.join(DEVICE_TYPES)} are supported")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"device {spec!r}: the CPU has no index; use cpu")
    return device


def resolve_device(spec: str, *, local_rank: int = 0) -> torch.device:
    """The device this worker trains on; `ConfigError` if this machine does not have it.

    Plain ``cuda`` spreads workers over the GPUs of a machine: local rank r gets GPU
    r mod count (``netsense launch`` ranks, or torchrun's LOCAL_RANK)."""
    try:
        device = parse_device(spec)
    except ValueError as exc:
        raise ConfigError(f"--{exc}") from None  # the flag's name: "--device 'tpu': ..."
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
        raise ConfigError(
            f"--device {spec!r}: CUDA is not available on this machine (torch {torch.__version__} built {build}, "
            f"{torch.cuda.device_count()} GPU(s) visible); use --device cpu"
        )
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else local_rank % count
    if index >= count:
        raise ConfigError(f"--device {spec!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters (CPU for a model without any)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")

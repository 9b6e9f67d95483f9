"""How a model's parameters map to PS keys: one key per tensor, large tensors split into chunks.

Chunking bounds the size of one message (and one decode) and lets a large tensor's pieces travel
on parallel streams; small tensors keep their shape so matrix codecs (low-rank) can see it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_CHUNK_ELEMS = 1 << 22  # 4 Mi elements = 16 MiB of fp32


@dataclass(frozen=True)
class KeySlot:
    """One PS key: a whole parameter or a flat chunk of it."""

    key: str
    """Key name on the wire (``name`` or ``name#i``)."""
    param: torch.nn.Parameter
    """The model parameter the key belongs to."""
    start: int
    """First flat element of the parameter covered by the key."""
    end: int
    """One past the last flat element."""
    shape: tuple[int, ...]
    """Shape of the key's tensor (the parameter's shape, or (end-start,) for a chunk)."""

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of `tensor` (shaped like `param`) that this key covers, as a view."""
        return tensor.reshape(-1)[self.start : self.end].view(self.shape)

    @property
    def numel(self) -> int:
        return self.end - self.start


def key_layout(model: torch.nn.Module, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> list[KeySlot]:
    """Keys of every trainable parameter, in registration order (deterministic on every worker)."""
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    slots: list[KeySlot] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        n = p.numel()
        if n <= chunk_elems:
            slots.append(KeySlot(name, p, 0, n, tuple(p.shape)))
            continue
        for i, start in enumerate(range(0, n, chunk_elems)):
            end = min(n, start + chunk_elems)
            slots.append(KeySlot(f"{name}#{i}", p, start, end, (end - start,)))
    if not slots:
        raise ValueError("the model has no trainable parameters")
    return slots

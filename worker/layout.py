"""How a model's parameters map to PS keys: one key per tensor, large tensors split into chunks.

Chunking bounds the size of one message (and one decode) and lets a large tensor's pieces travel
on parallel streams; small tensors keep their shape so matrix codecs (low-rank) can see it.
The model's other state (persistent buffers such as BatchNorm's running stats, and frozen
parameters) gets keys too (`state_layout`): they travel whole with every push and the PS averages
them (docs/ARCHITECTURE.md, "Model buffers"); `state_info` is the key -> state_dict name map
that INIT hands the PS, so a checkpoint can be exported as a plain `state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from netsense.transport.wire import TensorInfo

DEFAULT_CHUNK_ELEMS = 1 << 22  # 4 Mi elements = 16 MiB of fp32


@dataclass(frozen=True)
class KeySlot:
    """One PS key: a whole parameter or a flat chunk of it."""

    key: str
    """Key name on the wire (``name`` or ``name#i``)."""
    param: torch.Tensor
    """The model parameter (or, for a state key, the buffer) the key belongs to."""
    start: int
    """First flat element of the parameter covered by the key."""
    end: int
    """One past the last flat element."""
    shape: tuple[int, ...]
    """Shape of the key's tensor (the parameter's shape, or (end-start,) for a chunk)."""

    name: str = ""
    """The tensor's `state_dict` name (the key without its ``#i`` chunk suffix)."""
    buffer: bool = False
    """A state key (buffer or frozen parameter): pushed as its value, averaged, never optimized."""

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
            slots.append(KeySlot(name, p, 0, n, tuple(p.shape), name))
            continue
        slots.extend(_chunks(name, p, chunk_elems, buffer=False))
    if not slots:
        raise ValueError("the model has no trainable parameters")
    return slots


def state_layout(model: torch.nn.Module, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> list[KeySlot]:
    """Keys of the model's state that is not trained: persistent buffers (in `state_dict` order)
    and frozen parameters. Empty for a model without any, so its wire traffic is unchanged."""
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    slots: list[KeySlot] = []
    for name in model.state_dict(keep_vars=True):
        t = tensors.get(name)
        if t is None or (isinstance(t, torch.nn.Parameter) and t.requires_grad) or t.numel() == 0:
            continue  # trained parameters are `key_layout`'s; non-persistent buffers are not state
        if t.dtype not in STATE_DTYPES:
            raise ValueError(f"state tensor {name!r} has dtype {t.dtype}; supported: {sorted(STATE_DTYPES.values())}")
        if t.numel() <= chunk_elems:
            slots.append(KeySlot(name, t, 0, t.numel(), tuple(t.shape), name, buffer=True))
        else:
            slots.extend(_chunks(name, t, chunk_elems, buffer=True))
    return slots


def _chunks(name: str, t: torch.Tensor, chunk_elems: int, *, buffer: bool) -> list[KeySlot]:
    n = t.numel()
    return [
        KeySlot(f"{name}#{i}", t, start, min(n, start + chunk_elems), (min(n, start + chunk_elems) - start,), name, buffer)
        for i, start in enumerate(range(0, n, chunk_elems))
    ]


STATE_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}  # fmt: skip
"""Dtypes a state key may have. Integer and bool state travels as float64 on the wire (exact up to
2**53); the PS keeps the largest pushed value of those (counters such as `num_batches_tracked`)."""


def wire_value(slot: KeySlot) -> torch.Tensor:
    """A state key's value as it travels: its own dtype if the wire allows it, else float64."""
    value = slot.view(slot.param.detach())
    return value if value.is_floating_point() else value.to(torch.float64)


def state_info(slots: list[KeySlot]) -> dict[str, TensorInfo]:
    """Key -> what the PS needs to rebuild the `state_dict` entry: name, the whole tensor's shape
    and dtype, the key's first flat element, and whether it is a state key (never optimized)."""
    return {s.key: TensorInfo(s.name or s.key, tuple(s.param.shape), STATE_DTYPES[s.param.dtype], s.start, s.buffer) for s in slots}

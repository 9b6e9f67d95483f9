"""How a model's parameters map to PS keys: one key per tensor, large tensors split into chunks.

Chunking bounds the size of one message (and one decode) and lets a large tensor's pieces travel
on parallel streams; small tensors keep their shape so matrix codecs (low-rank) can see it, and a
chunk of a matrix is a block of whole rows, a matrix itself. With several PS shards a tensor
larger than a shard's fair share is chunked too (`shard_layout`), so the shards' bytes can be
balanced (`shard_sizes`: at dense and low-rank levels alike): across sites each direction then
carries its share in both halves of a step.
The model's other state (persistent buffers such as BatchNorm's running stats, and frozen
parameters) gets keys too (`state_layout`): they travel whole with every push and the PS averages
them (docs/ARCHITECTURE.md, "Model buffers"); `state_info` is the key -> state_dict name map
that INIT hands the PS, so a checkpoint can be exported as a plain `state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from netsense.compression.lowrank import wire_elems
from netsense.transport.wire import TensorInfo

DEFAULT_CHUNK_ELEMS = 1 << 22  # 4 Mi elements = 16 MiB of fp32
MIN_SHARD_CHUNK_ELEMS = 1 << 13
"""The least a tensor is chunked to for shard balance (8 Ki elements, 32 kB of fp32): below it a
key's per-message cost outweighs the balance."""


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
    """Shape of the key's tensor: the parameter's, a block of its rows, or (end-start,)."""

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

    def lowrank_size(self, rank: int) -> int:
        """Elements a rank-`rank` PowerSGD level sends of the key (`wire_elems`)."""
        return wire_elems(self.shape, rank)


def shard_sizes(slots: list[KeySlot]) -> list[tuple[str, tuple[int, int, int]]]:
    """(key, (elements, rank-1 size, rank-4 size)) per slot, the sizes `assign_shards` balances: a
    dense level sends in proportion to the first, a low-rank one about as the others (a matrix's
    factors grow with the rank, a vector's elements do not). Balanced on all three, a shard's
    share of a push is about the same at every level (docs/ARCHITECTURE.md, "Sharding")."""
    return [(s.key, (s.numel, s.lowrank_size(1), s.lowrank_size(4))) for s in slots]


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


def shard_layout(model: torch.nn.Module, shards: int, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> list[KeySlot]:
    """`key_layout` for a job of `shards` PS shards: no key above a shard's fair share of the
    trainable elements (nor below `MIN_SHARD_CHUNK_ELEMS`, nor above `chunk_elems`).

    Whole tensors balance badly when one dominates: wide-mlp's 544 x 544 matrix is 88 % of the
    model, so with one shard per site its shard's traffic crossed the WAN one way in the push and
    the other way in the pull while the opposite direction idled (docs/ARCHITECTURE.md, "Sharding").
    No smaller than the fair share: each row block is its own low-rank problem, and PowerSGD's
    factors grow with the blocks (half shares cost netsense 20-35 % on digits-cnn, measured).
    Every worker computes the same layout from the same model, as `assign_shards` needs."""
    if shards > 1:
        total = sum(p.numel() for p in model.parameters() if p.requires_grad)
        fair = -(-total // shards)
        chunk_elems = min(chunk_elems, max(MIN_SHARD_CHUNK_ELEMS, fair))
    return key_layout(model, chunk_elems)


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
    """Chunks of at most `chunk_elems`: blocks of whole rows (shaped like the tensor, fewer rows)
    where a row fits, else flat pieces."""
    n = t.numel()
    row = n // t.shape[0] if t.dim() >= 2 and t.shape[0] > 0 else 0
    if row and row <= chunk_elems:
        rows = chunk_elems // row
        return [
            KeySlot(f"{name}#{i}", t, r * row, min(t.shape[0], r + rows) * row, (min(t.shape[0], r + rows) - r, *t.shape[1:]), name, buffer)
            for i, r in enumerate(range(0, t.shape[0], rows))
        ]  # fmt: skip
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

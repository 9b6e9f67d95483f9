"""The worker's replica: the model as the PS shards last sent it.

It knows which shard owns each key (`assign_shards`: size-balanced and deterministic, so every
worker agrees), each shard's version, and how a PARAMS message is written into the model. Both
threads write it, never at once: the network thread applies the pulls of a (re)connect while the
training thread waits for it, the training thread applies each step's PARAMS.

The model's buffers (and frozen parameters) are state keys (`state`, all on shard 0): every step
pushes their values whole, the PS averages them, and PARAMS brings them back whole, so every
worker holds the same running statistics (docs/ARCHITECTURE.md, "Model buffers").
"""

from __future__ import annotations

import time

import torch

from netsense.compression import Payload, make_codec
from netsense.compression.limits import all_finite
from netsense.errors import CompressionError, ConfigError, ProtocolError
from netsense.transport.aggregate import weighted_sum
from netsense.transport.optimizer import Hyper, as_hyper
from netsense.transport.sharding import assign_shards
from netsense.transport.wire import Params, Sum, TensorInfo

from .layout import KeySlot, shard_layout, shard_sizes, state_info, state_layout, wire_value
from .mirror import OptimizerMirror


class Replica:
    """Keys of `model` spread over `shards` PS shards, and the version of each shard's keys."""

    def __init__(self, model: torch.nn.Module, chunk_elems: int, shards: int) -> None:
        self.slots: list[KeySlot] = shard_layout(model, shards, chunk_elems)
        if not 1 <= shards <= len(self.slots):
            raise ConfigError(f"{shards} PS shards for {len(self.slots)} keys: use 1..{len(self.slots)} shards")
        self.owner: dict[str, int] = assign_shards(shard_sizes(self.slots), shards)
        """Key -> index of the PS shard that owns it (the same on every worker)."""
        self.shard_slots: list[list[KeySlot]] = [[s for s in self.slots if self.owner[s.key] == i] for i in range(shards)]
        """Each shard's keys, in layout order."""
        self.state: list[KeySlot] = state_layout(model, chunk_elems)
        """State keys (buffers, frozen parameters): on shard 0, pushed and pulled whole."""
        self.state_on_ps = [False] * shards
        """Whether each shard's last full PARAMS held its state keys: a PS initialized by an older
        rank 0 (or checkpoint) has none, and would refuse them in a push as unknown keys."""
        self.versions: list[int] = [-1] * shards
        """Version of each shard's keys in this replica."""
        self.version = -1
        """The lowest of the shards' versions (in sync mode all advance together)."""
        self.mirrors: list[OptimizerMirror | None] = [None] * shards
        """Per shard, its optimizer run here when its downlink is in the gradient domain (mirror.py)."""
        self.hparams: tuple[dict[str, float], ...] = ()
        """The current step's param groups' hyper-parameters, as its pushes carry them (a
        gradient-domain update is stepped with them, as the PS steps it)."""
        self.key_groups: dict[str, int] = {}
        """Key -> its param group, for keys outside group 0 (with `hparams`)."""
        self.own: dict[str, Payload] = {}
        """This step's pushes, key -> payload as sent (the optimizer sets them before the step's
        PARAMS are applied): a forwarded update adds them to the others' (`Params.sums`)."""
        self.forwarded = False
        """Whether the last gradient-domain update came as forwarded pushes, every key of it: then
        what goes up comes down exact, compressed once (`Policy.compressions`)."""
        self.forwards = False
        """Whether a shard has forwarded pushes to this worker: it forwards alike ones, so a step at
        the other worker's level comes back compressed once (`Policy.join_compressions`)."""
        self._step_specs: list[tuple[int, str | None, tuple[str, ...]]] = [(-1, None, ())] * shards
        """Per shard, its last gradient-domain update's largest key's size, what `step_spec` reads of
        it and the update's intents of the other workers (`step_intents`)."""

    @property
    def gradient_domain(self) -> bool:
        """Every shard's downlink is in the gradient domain: each key comes back at the level of
        its smallest push, compressed a second time or forwarded (the uplink's policy prices that:
        `Policy.passes`, `Policy.compressions`)."""
        return all(m is not None for m in self.mirrors)

    def hyper(self, key: str) -> Hyper | None:
        """`key`'s hyper-parameters for the current step, as the PS keys them (None: none sent)."""
        return as_hyper(self.hparams[self.key_groups.get(key, 0)]) if self.hparams else None

    def shares(self) -> list[float]:
        """Each shard's fraction of the elements (of the dense payload)."""
        total = sum(s.numel for s in self.slots)
        return [sum(s.numel for s in slots) / total for slots in self.shard_slots]

    def shard_state(self, shard: int) -> list[KeySlot]:
        """The state keys `shard` holds (shard 0 holds them all)."""
        return self.state if shard == 0 else []

    def seed(self, shard: int) -> dict[str, Payload]:
        """Rank 0's current values of `shard`'s keys, lossless: what initializes an empty PS."""
        fp32 = make_codec("fp32")
        out = {s.key: fp32.encode(s.view(s.param.detach())) for s in self.shard_slots[shard]}
        out.update(self._state_payloads(shard))
        return out

    def state_payloads(self, shard: int) -> dict[str, Payload]:
        """This worker's current values of `shard`'s state keys, lossless, pushed every step; none
        to a PS that does not hold them (`state_on_ps`)."""
        return self._state_payloads(shard) if self.state_on_ps[shard] else {}

    def _state_payloads(self, shard: int) -> dict[str, Payload]:
        fp32 = make_codec("fp32")
        return {s.key: fp32.encode(wire_value(s)) for s in self.shard_state(shard)}

    def model_info(self, shard: int) -> dict[str, TensorInfo]:
        """INIT's key -> state_dict name map of `shard`'s keys (what `netsense export` needs)."""
        return state_info(self.shard_slots[shard] + self.shard_state(shard))

    def apply(self, params: Params, shard: int) -> float:
        """Write a PARAMS message of `shard` into the model, validated against its keys; returns
        the seconds spent decoding (the step's `decode_s`)."""
        slots = self.shard_slots[shard]
        if not params.full and params.base_version != self.versions[shard]:
            raise ProtocolError("version", f"delta for version {params.base_version}, replica is at {self.versions[shard]}")
        state = self.shard_state(shard)
        if params.full and len(params.tensors) not in (len(slots), len(slots) + len(state)):
            raise ProtocolError("keys", f"PS shard {shard} has {len(params.tensors)} keys, this model assigns it {len(slots)}")
        if params.gradient and params.full:
            raise ProtocolError("malformed", "a full PARAMS cannot be a gradient-domain update")
        if (params.optimizer or params.optim_state) and not params.full:
            raise ProtocolError("malformed", "optimizer settings and state come only with full PARAMS")
        if params.gradient:
            decode_s = self._step_mirror(params, shard)
        else:
            decode_s = self._write(params, shard)
        self._write_state(params, shard)
        self.versions[shard] = params.version
        self.version = min(self.versions)
        return decode_s

    def _step_mirror(self, params: Params, shard: int) -> float:
        """A gradient-domain update: the shard's optimizer, run here, steps on it; its new values
        are written into the model. Checked whole before anything changes."""
        mirror = self.mirrors[shard]
        if mirror is None:
            raise ProtocolError("version", f"a gradient-domain update from PS shard {shard}, which never sent its optimizer")
        grads, slots = {}, {s.key: s for s in self.shard_slots[shard]}
        td = time.perf_counter()
        for key, payload in params.tensors.items():
            if key in slots:
                if tuple(payload.shape) != slots[key].shape:
                    raise ProtocolError("shape", f"key {key!r}: PS shape {payload.shape} != model shape {slots[key].shape}")
                grads[key] = make_codec(payload.codec).decode(payload)
        for key, terms in params.sums.items():
            slot = slots.get(key)
            if slot is None:
                raise ProtocolError("key", f"forwarded pushes of key {key!r}, which PS shard {shard} does not own")
            grads[key] = self._sum(key, terms, slot.shape)
        decode_s = time.perf_counter() - td
        self.forwarded = bool(params.sums) and not any(k in slots for k in params.tensors)
        self.forwards = self.forwards or bool(params.sums)
        self._step_specs[shard] = (*self._step_spec(params, slots), params.intents)
        for key, value in mirror.step(grads, {k: self.hyper(k) for k in grads}).items():
            target = slots[key].view(slots[key].param.data)
            target.copy_(value.to(target.device, target.dtype))
        return decode_s

    @property
    def step_spec(self) -> str | None:
        """The level of the last step's smallest push of the model's largest key where another
        worker sent it (`Policy.step_spec`; None: this worker's own, or not known). The largest key
        of all shards': a shard of small keys (biases) sees pushes of every level alike in size."""
        return max(self._step_specs, key=lambda entry: entry[0])[1]

    @property
    def step_intents(self) -> tuple[str, ...]:
        """The other workers' intents (`Params.intents`) of the last step, from the update of the
        shard that holds the model's largest key, as `step_spec` (empty: not known)."""
        return max(self._step_specs, key=lambda entry: entry[0])[2]

    def _step_spec(self, params: Params, slots: dict[str, KeySlot]) -> tuple[int, str | None]:
        """The size of the update's largest key and the level of its smallest push where it was not
        this worker's own (None: it was, or not known): a forwarded update carries the pushes, and
        a compressed mean goes down at the smallest push's codec (a sparse mean sent exact at a
        codec no ladder holds, which the policy ignores)."""
        keys = [k for k in (*params.tensors, *params.sums) if k in slots]
        if not keys:
            return -1, None
        key = max(keys, key=lambda k: (slots[k].numel, k))
        return slots[key].numel, self._smallest(params, key)

    def _smallest(self, params: Params, key: str) -> str | None:
        """The codec of `key`'s smallest push of the step, None where it was this worker's own."""
        own = self.own.get(key)
        if key in params.tensors:
            smallest: str | None = params.tensors[key].codec
        else:
            pushes = params.sums[key].pushes
            least = min(pushes, key=lambda p: p.wire_size) if pushes else None
            smallest = None if least is None or (own is not None and own.wire_size <= least.wire_size) else least.codec
        return None if own is not None and smallest == own.codec else smallest

    def _sum(self, key: str, terms: Sum, shape: tuple[int, ...]) -> torch.Tensor:
        """The step's gradient of `key` from its forwarded pushes and this worker's own (`own`), in
        the PS's order and arithmetic (`weighted_sum`, in its parameters' float32): the PS's
        gradient bit for bit. Every push is checked as a PS checks one."""
        pushes = list(terms.pushes)
        if terms.own >= 0:
            mine = self.own.get(key)
            if mine is None:
                raise ProtocolError("key", f"forwarded pushes of key {key!r} count this worker's, which it did not push")
            pushes.insert(terms.own, mine)
        values = []
        for payload in pushes:
            if tuple(payload.shape) != shape:
                raise ProtocolError("shape", f"key {key!r}: forwarded shape {payload.shape} != model shape {shape}")
            try:
                value = make_codec(payload.codec).decode(payload)
            except CompressionError as exc:
                raise ProtocolError("bad-payload", f"forwarded push of {key!r}: {exc}") from None
            if not all_finite(value):
                raise ProtocolError("non-finite", f"forwarded push of {key!r} has NaN/Inf; rejected")
            values.append(value)
        return weighted_sum(list(zip(values, terms.weights)), torch.float32)

    def _write(self, params: Params, shard: int) -> float:
        """Parameters (full) or their change (a parameter-domain delta) into the model."""
        slots = self.shard_slots[shard]
        decode_s = 0.0
        values: dict[str, torch.Tensor] = {}
        for slot in slots:
            payload = params.tensors.get(slot.key)
            if payload is None:
                if params.full:
                    raise ProtocolError("key", f"PS parameters lack key {slot.key!r}: is it the same model?")
                continue
            if tuple(payload.shape) != slot.shape:
                raise ProtocolError("shape", f"key {slot.key!r}: PS shape {payload.shape} != model shape {slot.shape}")
            td = time.perf_counter()
            value = make_codec(payload.codec).decode(payload, device=slot.param.device)
            decode_s += time.perf_counter() - td
            target = slot.view(slot.param.data)
            if params.full:
                target.copy_(value)
                values[slot.key] = value
            else:
                target.add_(value.to(target.dtype))
        if params.full and params.optimizer:  # a gradient-domain PS: run its optimizer here
            mirror = OptimizerMirror(params.optimizer)
            mirror.load(values, params.optim_state)
            self.mirrors[shard] = mirror
        elif params.full:
            self.mirrors[shard] = None
        return decode_s

    def _write_state(self, params: Params, shard: int) -> None:
        state = self.shard_state(shard)
        if params.full:
            self.state_on_ps[shard] = bool(state) and len(params.tensors) == len(self.shard_slots[shard]) + len(state)
        for slot in state:  # state keys come whole, in full and delta messages alike
            payload = params.tensors.get(slot.key)
            if payload is None:
                continue  # a PS without state keys, or a keyed reply of other keys
            if tuple(payload.shape) != slot.shape:
                raise ProtocolError("shape", f"state key {slot.key!r}: PS shape {payload.shape} != model shape {slot.shape}")
            if payload.codec != "fp32":
                raise ProtocolError("bad-payload", f"state key {slot.key!r} must come lossless (fp32), got {payload.codec!r}")
            value = make_codec(payload.codec).decode(payload, device=slot.param.device)
            slot.view(slot.param.data).copy_(value.to(slot.param.dtype))

"""`OptimizerMirror`: a PS's optimizer, run on this worker's copy of its keys, for a downlink in
the gradient domain (docs/ARCHITECTURE.md, "Gradient-domain downlink").

A gradient-domain PS sends each step's compressed aggregated gradient and steps its optimizer on
exactly that; this mirror steps the same torch.optim class, built from the settings the PS sent,
on per-key fp32 CPU tensors of the same shapes, with the hyper-parameters this worker's push
carried for the step (the PS refuses a step whose workers' differ). Same arithmetic on the same
values: the replica equals the PS's parameters bit for bit on the same CPU kind. (Across CPU kinds
rounding may differ, as it does between DDP's ranks; a full PARAMS resyncs.) On CPU whatever the
model's device, so a GPU worker does not step differently from its PS.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from netsense.compression import Payload, make_codec
from netsense.compression.limits import all_finite
from netsense.errors import ConfigError, ProtocolError
from netsense.transport.optimizer import STATE_NAMES, Hyper, OptimizerSettings


class OptimizerMirror:
    """Per-key parameters and the optimizer over them, as the PS keeps them."""

    def __init__(self, settings: Mapping[str, object]) -> None:
        try:
            self.settings = OptimizerSettings.from_dict(dict(settings))
        except ConfigError as exc:
            raise ProtocolError("malformed", f"PS optimizer settings: {exc}") from None
        self.params: dict[str, torch.Tensor] = {}
        """Key -> its value as the PS holds it (fp32, CPU)."""
        self.optimizer: torch.optim.Optimizer | None = None

    def load(self, values: Mapping[str, torch.Tensor], state: Mapping[str, Payload]) -> None:
        """Take one PS's full PARAMS: its keys' values and its optimizer's state (the mirror is
        that PS's: one per shard)."""
        self.params = {key: value.detach().to("cpu", torch.float32).clone() for key, value in values.items()}
        self.optimizer = self.settings.build(list(self.params.values()))
        fp32 = make_codec("fp32")
        for wire_key, payload in state.items():
            name, _, key = wire_key.partition(":")
            param = self.params.get(key)
            if name not in STATE_NAMES or param is None:
                raise ProtocolError("key", f"optimizer state {wire_key!r}: unknown state name or key")
            if payload.codec != "fp32" or payload.dtype != "float32":
                raise ProtocolError("bad-payload", f"optimizer state {wire_key!r} must come as fp32 float32")
            expected = () if name == "step" else tuple(param.shape)
            if tuple(payload.shape) != expected:
                raise ProtocolError("shape", f"optimizer state {wire_key!r}: shape {payload.shape} != {expected}")
            value = fp32.decode(payload)
            if not all_finite(value) or (name in ("exp_avg_sq", "step") and bool((value < 0).any())):
                raise ProtocolError("non-finite", f"optimizer state {wire_key!r} is NaN/Inf or negative")
            self.optimizer.state[param][name] = value.clone()
        names = {"sgd": {"momentum_buffer"}}.get(self.settings.name, {"exp_avg", "exp_avg_sq", "step"})
        for key, param in self.params.items():
            held = set(self.optimizer.state.get(param, {}))
            if held and held != names:  # a partial state would fail inside torch's step, not here
                raise ProtocolError("key", f"optimizer state of {key!r}: {sorted(held)}, a {self.settings.name} step needs {sorted(names)}")

    def step(self, grads: Mapping[str, torch.Tensor], hyper: Mapping[str, Hyper | None]) -> dict[str, torch.Tensor]:
        """One optimizer step of the keys in `grads` (each with its hyper-parameters, None: the
        settings'), grouped as the PS groups them; returns their new values."""
        if self.optimizer is None:
            raise ProtocolError("version", "a gradient-domain update before the PS's full parameters")
        for key, grad in grads.items():
            param = self.params.get(key)
            if param is None:
                raise ProtocolError("key", f"gradient-domain update of key {key!r}, which this worker's PS does not hold")
            if tuple(grad.shape) != tuple(param.shape):
                raise ProtocolError("shape", f"key {key!r}: update shape {tuple(grad.shape)} != {tuple(param.shape)}")
            if not all_finite(grad):
                raise ProtocolError("non-finite", f"gradient-domain update of {key!r} has NaN/Inf; rejected")
        by_hyper: dict[Hyper | None, set[str]] = {}
        for key in grads:
            by_hyper.setdefault(hyper.get(key), set()).add(key)
        try:
            for group_hyper, keys in by_hyper.items():
                for key, param in self.params.items():
                    param.grad = grads[key].to(torch.float32) if key in keys else None
                with self.settings.step_with(self.optimizer, group_hyper):
                    self.optimizer.step()
        finally:
            for param in self.params.values():
                param.grad = None
        return {key: self.params[key] for key in grads}

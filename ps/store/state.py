"""The store's checkpoint state: what `ParameterStore.state()` hands to ps/checkpoint.py and what
`ParameterStore.restore()` takes back.

Plain containers of copied tensors, so a snapshot taken on the PS loop can be serialised on another
thread while training goes on. Pending pushes are not part of it: workers re-push after they
reconnect. Stateful downlink encoders restart empty; workers pull the full shadow after a restart;
what the gradient-domain downlink's error feedback still owed is kept (`residuals`).
The state keys (buffers), the key -> state_dict name map and the job id are in it too, so a
checkpoint can be exported as a plain `state_dict` (ps/checkpoint.py, `export_state_dict`) and a
restarted PS still knows its job.
"""

from __future__ import annotations

import torch

from netsense.compression.limits import all_finite
from netsense.errors import ProtocolError
from netsense.transport.wire import TensorInfo

from ..optim import OptimizerSettings
from .core import StoreCore
from .encode import UpdateEncoder
from .guard import UpdateRefused, check_update

FORMAT = 1
"""Version of the state layout; `restore` refuses any other."""


def snapshot(core: StoreCore, encoder: UpdateEncoder) -> dict[str, object]:
    """Everything a restart needs (call between steps)."""
    assert core.optimizer is not None and core.optimizer_settings is not None
    return {
        "format": FORMAT,
        "version": core.version,
        "applied_steps": core.applied_steps,
        "params": {k: v.detach().clone() for k, v in core.params.items()},
        "shadow": {k: v.clone() for k, v in encoder.shadow.items()},
        "optimizer_settings": core.optimizer_settings.to_dict(),
        "optimizer_state": clone_tree(core.optimizer.state_dict()),
        "live": sorted(core.live),
        "clocks": dict(core.clocks),
        "downlink_codec": encoder.spec,
        "state": {k: v.clone() for k, v in core.state.items()},
        "model": {k: info_to_dict(i) for k, i in core.model.items()},
        "job_id": core.job_id,
        "downlink_residual": {k: v.clone() for k, v in core.gradient.residual.items()} if core.gradient else {},
    }


def restore(core: StoreCore, encoder: UpdateEncoder, state: dict[str, object]) -> None:
    """Load a `snapshot` into a fresh core and encoder."""
    if state.get("format") != FORMAT:
        raise ProtocolError("checkpoint", f"unknown checkpoint format {state.get('format')!r}")
    params = {str(k): v.to(torch.float32).clone() for k, v in dict(state["params"]).items()}  # type: ignore[call-overload]
    settings = OptimizerSettings.from_dict(dict(state["optimizer_settings"]))  # type: ignore[call-overload]
    core.params = params
    encoder.shadow = {str(k): v.clone() for k, v in dict(state["shadow"]).items()}  # type: ignore[call-overload]
    core.optimizer_settings = settings
    core.optimizer = settings.build(list(params.values()))
    core.optimizer.load_state_dict(state["optimizer_state"])  # type: ignore[arg-type]
    core.guard.forget()
    try:  # a checkpoint is never the way poison gets in (an older PS could write one)
        check_update(core.optimizer, [*params.values(), *encoder.shadow.values()])
    except UpdateRefused:
        core.params, core.optimizer, core.optimizer_settings, encoder.shadow = {}, None, None, {}
        raise ProtocolError("checkpoint", "parameters, shadow or optimizer state hold NaN/Inf; not restored") from None
    core.version = int(state["version"])  # type: ignore[call-overload]
    core.applied_steps = int(state["applied_steps"])  # type: ignore[call-overload]
    core.live = set(state["live"])  # type: ignore[call-overload]
    core.clocks = {str(k): int(v) for k, v in dict(state.get("clocks", {})).items()}  # type: ignore[call-overload]
    encoder.spec = str(state.get("downlink_codec", encoder.spec))
    core.state = {str(k): v.clone() for k, v in dict(state.get("state", {})).items()}  # type: ignore[call-overload]
    core.model = {str(k): info_from_dict(dict(v)) for k, v in dict(state.get("model", {})).items()}  # type: ignore[call-overload]
    core.job_id = str(state.get("job_id", ""))
    encoder.restart_codecs()
    core.pending.clear()
    encoder.last_update = None


def residuals(state: dict[str, object]) -> dict[str, torch.Tensor]:
    """What the gradient-domain downlink still owed at the snapshot (none from a parameter-domain
    one or a PS from before it was kept), checked as the parameters are: a key of the snapshot's
    parameters, its shape, finite. Read before `restore`, so a bad one changes nothing."""
    params = dict(state.get("params", {}))  # type: ignore[call-overload]
    out = {}
    for key, value in dict(state.get("downlink_residual", {})).items():  # type: ignore[call-overload]
        param = params.get(key)
        if param is None or not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(param.shape):
            raise ProtocolError("checkpoint", f"downlink residual {key!r} matches no parameter of its shape; not restored")
        if not all_finite(value):
            raise ProtocolError("checkpoint", f"downlink residual {key!r} holds NaN/Inf; not restored")
        out[str(key)] = value.to(param.dtype).clone()
    return out


def info_to_dict(info: TensorInfo) -> dict[str, object]:
    """A `TensorInfo` as plain values (checkpoints are read with ``weights_only=True``)."""
    return {"name": info.name, "shape": list(info.shape), "dtype": info.dtype, "offset": info.offset, "buffer": info.buffer}


def info_from_dict(d: dict[str, object]) -> TensorInfo:
    return TensorInfo(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]), int(d["offset"]), bool(d["buffer"]))  # type: ignore[attr-defined, call-overload]


def clone_tree(value: object) -> object:
    """Deep-copy the tensors of a (nested) state dict, so a snapshot does not alias live state."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_tree(v) for v in value)
    return value

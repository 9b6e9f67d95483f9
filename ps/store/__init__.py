"""The PS's authoritative state: a pure, synchronous state machine (no sockets, no loop, no clock).

`ParameterStore` (store.py) is the public face; the parts it routes calls to:

- core.py: parameters, optimizer, live workers, pending pushes; push validation and the
  torch.optim apply every mode shares.
- sync.py: `SyncBarrier`, the default mode: a step applies when every live worker has pushed
  every key (BSP).
- ssp.py: `SspClocks`, async mode (``staleness=s``): each complete push applies alone, clocks keep
  a worker at most s versions ahead (SSP).
- pipeline.py: `PipelinedStep`, keys of a sync step applied ahead of the version for keyed pulls.
- encode.py: `UpdateEncoder`, the downlink shadow and the update bytes every worker gets (the
  policy that picks their codec is ps/downlink.py).
- state.py: the checkpoint state that ps/checkpoint.py writes.
"""

from __future__ import annotations

from .core import StepApplied
from .store import ParameterStore

__all__ = ["ParameterStore", "StepApplied"]

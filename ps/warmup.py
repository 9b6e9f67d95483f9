"""torch's one-time lazy costs, paid before the PS listens instead of on its event loop mid-job.

The first `torch.optim` optimizer a process builds imports torch._dynamo (and with it sympy and
parts of inductor): 2 s on an idle core, over 10 s at load ~16. The PS builds its optimizer when
rank 0's INIT arrives, on the event loop that serves every connection, so for those seconds it
answered no packet, and a worker whose last packet was the INIT it had just sent reached the QUIC
idle timeout (docs/RELIABILITY.md, "Job start under load"). Built here once per process, with a
step, a checkpoint's `state_dict` and a resume's `load_state_dict` of every optimizer the PS
offers, the same code paths later take microseconds.
"""

from __future__ import annotations

import logging
import time

import torch

from .optim import OptimizerSettings

log = logging.getLogger(__name__)

_done = False


def warm_up_torch() -> float:
    """Build, step and round-trip each PS optimizer once (idempotent); returns the seconds spent."""
    global _done
    if _done:
        return 0.0
    t0 = time.perf_counter()
    for name in ("sgd", "adam", "adamw"):
        param = torch.zeros(1, requires_grad=True)
        optimizer = OptimizerSettings(name=name).build([param])
        param.grad = torch.zeros(1)
        optimizer.step()
        optimizer.load_state_dict(optimizer.state_dict())
        optimizer.zero_grad()
        torch.nn.utils.clip_grad_norm_([param], 1.0)
    _done = True
    seconds = time.perf_counter() - t0
    log.debug("torch optimizers warmed up in %.2f s", seconds)
    return seconds

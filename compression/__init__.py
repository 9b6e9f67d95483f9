"""Codecs, error feedback, the level ladder and the adaptive policies: pure code, no I/O."""

from __future__ import annotations

from . import dense as _dense  # noqa: F401  (registers fp32 / fp16 / bf16)
from .base import DTYPES, Codec, Payload, codec_names, make_codec, register_codec
from .link import LinkState

__all__ = ["DTYPES", "Codec", "LinkState", "Payload", "codec_names", "make_codec", "register_codec"]

# Lossy codecs register themselves on import (qsgd, topk, topka, randk, threshold, powersgd).
from . import lowrank as _lowrank  # noqa: E402, F401
from . import quantize as _quantize  # noqa: E402, F401
from . import sparse as _sparse  # noqa: E402, F401
from .feedback import ErrorFeedback  # noqa: E402

__all__ += ["ErrorFeedback"]

# The level ladder and the adaptive policies (DESIGN.md §5).
from .ladder import DEFAULT_LADDER, Ladder, Level  # noqa: E402
from .policy import (  # noqa: E402
    Decision,
    NetsensePolicySettings,
    Policy,
    make_policy,
    policy_names,
    register_policy,
)

__all__ += [
    "DEFAULT_LADDER",
    "Decision",
    "Ladder",
    "Level",
    "NetsensePolicySettings",
    "Policy",
    "make_policy",
    "policy_names",
    "register_policy",
]

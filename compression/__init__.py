"""Codecs, error feedback, the level ladder and the adaptive policies: pure code, no I/O."""

from __future__ import annotations

# Codec modules register themselves on import (fp32/fp16/bf16, qsgd, topk, topka, randk,
# threshold, powersgd), so importing the package makes every spec available to make_codec.
from . import dense as _dense  # noqa: F401
from . import lowrank as _lowrank  # noqa: F401
from . import quantize as _quantize  # noqa: F401
from . import sparse as _sparse  # noqa: F401
from .base import DTYPES, Codec, Payload, codec_names, make_codec, register_codec
from .feedback import ErrorFeedback, NonFiniteGradient
from .policy import (
    ChooseRequest,
    Decision,
    NetsensePolicySettings,
    Policy,
    make_policy,
    policy_names,
    register_policy,
)
from .policy.ladder import DEFAULT_LADDER, Ladder, Level
from .policy.link import LinkState

__all__ = [
    "DEFAULT_LADDER",
    "DTYPES",
    "ChooseRequest",
    "Codec",
    "Decision",
    "ErrorFeedback",
    "Ladder",
    "Level",
    "LinkState",
    "NetsensePolicySettings",
    "NonFiniteGradient",
    "Payload",
    "Policy",
    "codec_names",
    "make_codec",
    "make_policy",
    "policy_names",
    "register_codec",
    "register_policy",
]

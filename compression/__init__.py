"""Codecs, error feedback, the level ladder and the adaptive policies: pure code, no I/O."""

from __future__ import annotations

from . import dense as _dense  # noqa: F401  (registers fp32 / fp16 / bf16)
from .base import DTYPES, Codec, Payload, codec_names, make_codec, register_codec
from .link import LinkState

__all__ = ["DTYPES", "Codec", "LinkState", "Payload", "codec_names", "make_codec", "register_codec"]

"""Per-key codec instances of a sender whose level changes from step to step.

Stateful codecs keep state per key (PowerSGD its warm-start basis), so a sender keeps one instance
per key and level. When a key goes out at a level other than the one it went at last, that level's
codec first takes over what the last one knew (`Codec.follow`): a PowerSGD level resumed after
another rank starts from that rank's basis, not its own stale one (docs/POLICIES.md, "Switching
levels"). Sans I/O.
"""

from __future__ import annotations

from collections.abc import Hashable

from .base import Codec, make_codec


class KeyCodecs:
    """(key, spec) -> codec, made on first use, and the codec each key last went out with."""

    def __init__(self) -> None:
        self._codecs: dict[tuple[Hashable, str], Codec] = {}
        self._last: dict[Hashable, Codec] = {}

    def get(self, key: Hashable, spec: str) -> Codec:
        """The codec that sends `key` at `spec` now (made on first use); when `key` last went at
        another spec, it follows that codec first."""
        codec = self._codecs.get((key, spec))
        if codec is None:
            codec = self._codecs[(key, spec)] = make_codec(spec)
        last = self._last.get(key)
        if last is not None and last is not codec:
            codec.follow(last)
        self._last[key] = codec
        return codec

    def __contains__(self, item: tuple[Hashable, str]) -> bool:
        return item in self._codecs

    def __len__(self) -> int:
        return len(self._codecs)

    def clear(self) -> None:
        """Forget every codec and its state (a restore, or a job whose specs keep changing)."""
        self._codecs.clear()
        self._last.clear()

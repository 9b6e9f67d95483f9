"""Log lines that a peer cannot forge or flood.

Anything that came off the wire (worker ids, error reasons, exception texts quoting peer bytes)
goes through `printable` before it reaches a log line: a newline in a worker id would otherwise
write a second, forged record. `LogLimiter` caps how often one peer can make us log, so a peer
that sends 2000 bad streams costs one line per interval (with a count of what was suppressed),
not 2000.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

MAX_LOGGED_CHARS = 200
"""Longest peer string written to a log line; the rest is counted, not written."""


def printable(value: object, limit: int = MAX_LOGGED_CHARS) -> str:
    """`value` as text with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\u2028``)
    and at most `limit` characters kept, so it stays one honest piece of one log line."""
    text = str(value)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return out if len(text) <= limit else f"{out}...(+{len(text) - limit} chars)"


def quoted(value: str, limit: int = 64) -> str:
    """A peer-chosen name as a quoted, escaped, bounded token (``'w0\\n'``) for log lines."""
    return repr(value[:limit]) + ("..." if len(value) > limit else "")


class LogLimiter:
    """At most one line per key (a peer address, a connection) per `interval_s`.

    `allow(key)` is None while the key is muted; otherwise it returns how many lines were
    suppressed since the last one allowed (append that to the line). It remembers at most
    `max_keys` keys, oldest forgotten first, so a stranger cycling addresses cannot grow it."""

    def __init__(self, interval_s: float = 10.0, *, max_keys: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._seen: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def allow(self, key: Hashable) -> int | None:
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            return None
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return 0 if last is None else last[1]


def suppressed_note(count: int) -> str:
    """The tail a rate-limited line carries: empty, or how many like it were not written."""
    return f" ({count} more like this suppressed)" if count else ""

"""transport/logsafe.py: peer strings are escaped into one bounded piece of one log line, and a
peer can make us log at most one line per interval (with a count of the rest)."""

from __future__ import annotations

from netsense.transport.logsafe import LogLimiter, printable, quoted, suppressed_note


def test_printable_escapes_every_control_character_and_bounds_the_length() -> None:
    assert printable("w0\nINFO forged") == "w0\\nINFO forged"
    assert printable("a\x1b[2J\r\tb\u2028c\x00") == "a\\x1b[2J\\r\\tb\\u2028c\\x00"
    assert printable("wörker 名") == "wörker 名"  # printable text stays readable
    long = printable("x" * 1000, limit=10)
    assert long == "x" * 10 + "...(+990 chars)"
    assert printable(ValueError("bad\nthing")) == "bad\\nthing"


def test_quoted_names_are_one_token() -> None:
    assert quoted("w0") == "'w0'"
    assert quoted("w0'\n") == '"w0\'\\n"'
    assert quoted("y" * 100, limit=4) == "'yyyy'..."


def test_log_limiter_allows_one_line_per_key_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    lim = LogLimiter(10.0, clock=lambda: now[0], max_keys=2)
    assert lim.allow("a") == 0
    assert [lim.allow("a") for _ in range(5)] == [None] * 5
    assert lim.allow("b") == 0  # another peer is not muted by the first
    now[0] = 10.0
    assert lim.allow("a") == 5  # the next line says how many were suppressed
    assert lim.allow("a") is None
    lim.allow("c")  # a third key: the oldest is forgotten, memory stays bounded
    assert len(lim._seen) == 2
    assert suppressed_note(0) == "" and suppressed_note(5) == " (5 more like this suppressed)"

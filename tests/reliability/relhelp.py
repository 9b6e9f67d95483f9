"""Helpers for the reliability tests: real `netsense ps` / `netsense worker` processes on loopback."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

VERBOSE: list[str] = []
"""Extra CLI verbosity flags (the secrets test sets -vv for its own processes)."""


RUNNING: list[Proc] = []
"""Every child started; the conftest kills survivors after each test."""


def kill_all() -> None:
    while RUNNING:
        proc = RUNNING.pop()
        if proc.p.poll() is None:
            proc.p.kill()
            proc.p.wait(10)


class Proc:
    """A child process whose stdout JSON lines are collected on a thread; stderr goes to a file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self.p = subprocess.Popen(
            [sys.executable, "-m", "netsense", *args],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )  # fmt: skip
        RUNNING.append(self)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    self.events.put(json.loads(line))
                except json.JSONDecodeError:
                    pass

    def next_event(self, pred: Any, timeout: float) -> dict[str, Any]:
        """The first event (seen so far or arriving within `timeout`) for which `pred` is true."""
        for e in self.seen:
            if pred(e):
                return e
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout} s from {self.args[:1]}; log:\n{self.log()[-3000:]}")
            try:
                e = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.p.poll() is not None and self.events.empty():
                    raise AssertionError(f"{self.args[:1]} exited {self.p.returncode}; log:\n{self.log()[-3000:]}") from None
                continue
            self.seen.append(e)
            if pred(e):
                return e

    def drain(self) -> list[dict[str, Any]]:
        while True:
            try:
                self.seen.append(self.events.get_nowait())
            except queue.Empty:
                return self.seen

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        rc = self.p.wait(timeout)
        time.sleep(0.2)  # let the reader thread take the last lines
        self.drain()
        self._log.close()
        return rc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            self.p.wait(30)
        self.drain()


def start_ps(tmp: Path, certs: Path, *extra: str, name: str = "ps") -> tuple[Proc, int]:
    ps = Proc([*VERBOSE, "ps", "--port", "0", "--certs", str(certs), *extra], tmp / f"{name}.log")
    ready = ps.next_event(lambda e: e.get("event") == "ready", 60)
    return ps, int(ready["port"])


def start_worker(tmp: Path, certs: Path, port: int, rank: int, world: int, *extra: str, name: str | None = None) -> Proc:
    name = name or f"w{rank}"
    return Proc(
        [*VERBOSE, "worker", "--ps", f"127.0.0.1:{port}", "--rank", str(rank), "--world-size", str(world),
         "--worker-id", f"w{rank}", "--certs", str(certs), "--events", "--summary-json", str(tmp / f"{name}.json"), *extra],
        tmp / f"{name}.log",
    )  # fmt: skip


def stop_ps(ps: Proc) -> dict[str, Any]:
    """SIGTERM the PS; its last JSON line (version, errors_sent, applied_steps)."""
    ps.kill(signal.SIGTERM)
    return ps.next_event(lambda e: e.get("event") == "stopped", 10)


def summary(tmp: Path, name: str) -> dict[str, Any]:
    return json.loads((tmp / f"{name}.json").read_text())

"""`netsense launch` restarts a time-varying emulated link when training starts (docs/EMULATOR.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netsense.config import JobConfig
from netsense.launch.launcher import Launcher

# A stand-in for `netsense emulate`: says when SIGUSR1 came; SIGTERM ends it.
_CHILD = """
import signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: print("usr1", flush=True))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # after a pending SIGUSR1's handler (lower number)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize(
    ("link", "trace", "signalled"),
    [
        ("rate=0s:50mbit,4s:10mbit,8s:loop,delay=10ms", None, True),
        ("delay=20ms", str(Path(__file__).resolve().parents[1] / "examples" / "traces" / "cellular.mahimahi"), True),
        ("rate=50mbit,delay=10ms", None, False),
        ("delay=10ms", None, False),
    ],
)
def test_only_a_time_varying_link_is_restarted(link: str, trace: str | None, signalled: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        Launcher(JobConfig(), link=link, trace=trace)._restart_traces([proc])
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert ("usr1" in out) is signalled

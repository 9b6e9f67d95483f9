"""`netsense emulate` starts without importing torch.

The launcher starts one emulator per shard after the PS is ready and before any worker, waiting
for its port: its start-up is on every emulated job's critical path. `import torch` costs ~2 s of
CPU (more on a loaded 2-core machine), and the emulator only moves UDP datagrams, so it must not
pay it: neither through the CLI's parser (which once imported every subcommand module) nor
through `netsense.transport`'s re-exports (`NetworkSignal` pulls in the compression package).

Checked in fresh interpreters: this one has imported torch already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

EMULATE_HELP = r"""
import sys
from netsense.cli import main
try:
    main(["emulate", "--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
heavy = sorted(m for m in ("torch", "numpy") if m in sys.modules)
assert not heavy, heavy
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_emulate_command_does_not_import_torch() -> None:
    """The whole `netsense emulate` path: parser, module, the emulator it runs."""
    out = _run(EMULATE_HELP)
    assert out.returncode == 0, out.stderr
    assert "--upstream" in out.stdout  # the emulate parser was built, not a bare top-level one


@pytest.mark.parametrize("module", ["netsense.cli.emulate", "netsense.transport", "netsense.transport.emulation.emulator"])
def test_module_imports_without_torch(module: str) -> None:
    out = _run(f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'")
    assert out.returncode == 0, out.stderr


def test_transport_still_exports_the_signal() -> None:
    """The lazy re-export resolves to the same class as the submodule's."""
    from netsense.transport import NetworkSignal, SignalReader
    from netsense.transport.sensing.signal import NetworkSignal as N, SignalReader as R

    assert (NetworkSignal, SignalReader) == (N, R)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["emulate", "--link", "20mbit"], "emulate"),
        (["-vv", "emulate"], "emulate"),
        (["--verbose", "-v", "launch", "-h"], "launch"),
        (["-h", "emulate"], None),  # the top-level help lists every command
        (["nonsense"], None),  # "invalid choice" lists every command
        (["--verb", "emulate"], None),  # an abbreviation argparse accepts: leave it to the full parser
        ([], None),
    ],
)
def test_command_of(argv: list[str], command: str | None) -> None:
    from netsense.cli import command_of

    assert command_of(argv) == command


def test_unknown_command_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    from netsense.cli import _COMMANDS, main

    with pytest.raises(SystemExit):
        main(["nonsense"])
    err = capsys.readouterr().err
    assert all(c in err for c in _COMMANDS), err

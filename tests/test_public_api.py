"""What each package promises: its `__all__` exists, is importable, and does not shrink by accident."""

from __future__ import annotations

import importlib
import inspect

import pytest

PROMISED = {
    "netsense": {"NetSenseError", "ConfigError", "ProtocolError", "AuthError", "CompressionError", "PeerTimeout"},
    "netsense.compression": {"Codec", "Payload", "make_codec", "ErrorFeedback", "Ladder", "Policy", "make_policy", "LinkState"},
    "netsense.transport": {"LinkEmulator", "NetworkSignal", "SignalReader", "TransportSettings", "make_dev_certs", "decode_message"},
    "netsense.ps": {"ParameterStore", "PSServer", "ServerSettings", "OptimizerSettings"},
    "netsense.worker": {"NetSenseOptimizer", "ConnectSettings", "TrainTask", "PSClient"},
}


def test_every_error_is_exported() -> None:
    """The exception tree is one module, exported whole: a caller catches any NetSense error from
    `netsense` without knowing which layer raised it, and a new class cannot be left out."""
    import netsense
    from netsense import errors

    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.NetSenseError) and obj.__module__ == errors.__name__
    }
    assert "NetSenseError" in defined and len(defined) > 1
    assert sorted(defined - set(netsense.__all__)) == []
    for name in defined:
        assert getattr(netsense, name) is getattr(errors, name)


@pytest.mark.parametrize("package", sorted(PROMISED))
def test_exports(package: str) -> None:
    module = importlib.import_module(package)
    assert PROMISED[package] <= set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_compression_imports_no_io() -> None:
    """compression/ is pure: importing it must not pull in asyncio or aioquic (docs/ARCHITECTURE.md, "Layers")."""
    import subprocess
    import sys

    code = "import sys, netsense.compression; print('aioquic' in sys.modules, 'asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False"

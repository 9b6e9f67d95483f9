"""The CLI: every command has --help with an example; errors exit 2 with a message."""

from __future__ import annotations

import pytest

from netsense.cli import build_parser, main


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[union-attr]


def test_foundation_commands_exist() -> None:
    assert {"ps", "worker", "launch", "certs"} <= set(_commands())


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_help_with_an_example(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "Example" in capsys.readouterr().out


def test_config_error_exits_2(capsys, tmp_path) -> None:
    assert main(["worker", "--ps", "nohost", "--insecure"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_certs_command_writes_files(tmp_path, capsys) -> None:
    assert main(["certs", "--out", str(tmp_path), "--host", "ps.example", "--host", "10.9.8.7"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"ca.pem", "server.pem", "server.key", "secret"}

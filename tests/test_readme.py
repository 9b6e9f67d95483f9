"""README: the Python API example runs verbatim; the two set-up commands are the ones CI uses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import RunningPS

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_api_example_runs_verbatim(ps: RunningPS, tmp_path: Path) -> None:
    text = README.read_text()
    block = text.split("<!-- readme-example")[1]
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)  # type: ignore[union-attr]
    assert len(code.splitlines()) <= 25
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "NETSENSE_PS": f"127.0.0.1:{ps.port}", "NETSENSE_CERTS": str(ps.certs.ca.parent)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "at version 20" in out.stdout
    assert ps.server.store.version == 20


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text()
    quick = text.split("## Quick start")[1].split("\n## ")[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quick, re.S)
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci

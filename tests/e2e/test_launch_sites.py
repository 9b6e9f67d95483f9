"""`netsense launch --sites`: two sites on loopback, a PS shard at each; every child is told its site,
a worker reaches its own site's shard directly and the other site's through the emulated link, and
the job trains as the same two shards do without sites (sync, lossless: sites only place keys)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from netsense.config import JobConfig, override
from netsense.launch.launcher import Launcher
from netsense.launch.sites import parse_sites

from .test_launch import _launch, _procs_mentioning


class _Recording(Launcher):
    """Notes each child's command, its site, and the ports the shards announced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spawned: list[tuple[list[str], str | None]] = []
        self.ready: list[int] = []

    def _spawn(self, cmd: list[str], site: str | None = None) -> subprocess.Popen[str]:
        self.spawned.append((cmd, site))
        return super()._spawn(cmd, site)

    def _wait_ready(self, ps: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
        port = super()._wait_ready(ps, timeout_s)
        self.ready.append(port)
        return port


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


@pytest.mark.slow
def test_two_sites_place_shards_and_keep_local_traffic_off_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = override(
        JobConfig(), sites=parse_sites("a:workers=1,shards=1;b:workers=1,shards=1"), train__steps=6,
        train__eval_every=0, security__insecure=True, transport__idle_timeout_s=60.0,
    )  # fmt: skip
    done: dict[int, dict[str, Any]] = {}
    launcher = _Recording(config, run_dir=tmp_path / "run", link="rate=200mbit,delay=5ms",
                          on_event=lambda r, e: done.update({r: e}) if e.get("event") == "done" else None)  # fmt: skip
    summary = launcher.run()
    assert summary["workers"] == 2 and summary["servers"] == 2 and summary["steps"] == 6
    assert summary["sites"] == [{"name": "a", "ranks": [0], "shards": [0]}, {"name": "b", "ranks": [1], "shards": [1]}]
    assert {r: e["site"] for r, e in done.items()} == {0: "a", 1: "b"}  # each worker was told its site
    ps = [(c, s) for c, s in launcher.spawned if "ps" in c[3:5]]
    workers = [(c, s) for c, s in launcher.spawned if "worker" in c[3:5]]
    assert [(_flag(c, "--site"), s) for c, s in ps] == [("a", "a"), ("b", "b")]
    assert [(_flag(c, "--site"), s) for c, s in workers] == [("a", "a"), ("b", "b")]
    for rank, (cmd, _) in enumerate(workers):
        ports = [int(a.rpartition(":")[2]) for a in _flag(cmd, "--ps").split(",")]
        # its own site's shard directly (the port the shard announced), the other's through the emulator
        assert ports[rank] == launcher.ready[rank]
        assert ports[1 - rank] != launcher.ready[1 - rank]
    assert json.loads((tmp_path / "run" / "launch.json").read_text())["sites"] == "a:workers=1,shards=1;b:workers=1,shards=1"


@pytest.mark.slow
@pytest.mark.timeout(600)  # two whole jobs; minutes on 2 shared cores
def test_launch_with_sites_trains_as_two_shards_do(tmp_path: Path) -> None:
    summaries = {}
    for name, args in (("sites", ["--sites", "a;b"]), ("shards", ["--servers", "2", "--workers", "2"])):
        out = tmp_path / f"{name}.json"
        proc = _launch(tmp_path, *args, "--steps", "6", "--eval-every", "0", "--idle-timeout", "60",
                       "--summary-json", str(out), timeout=400)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries[name] = json.loads(out.read_text())
    assert summaries["sites"]["steps"] == 6 and summaries["sites"]["servers"] == 2
    assert summaries["sites"]["final_loss"] == pytest.approx(summaries["shards"]["final_loss"], abs=1e-6)
    assert summaries["sites"]["test_accuracy"] == summaries["shards"]["test_accuracy"]
    assert not _procs_mentioning(str(tmp_path / "run"))

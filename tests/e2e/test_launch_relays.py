"""`netsense launch --sites` with 2 sites x 2 workers runs a relay at each site: the job trains as
the same job without relays does (sync-SGD kept; sums per site then over sites, so to rounding),
and each relay's upstream bytes are one model per step each way, whatever its site's workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from netsense.cli import main
from netsense.config import JobConfig, override
from netsense.launch.launcher import Launcher
from netsense.launch.sites import parse_sites
from netsense.models import load_task

from .test_launch import _procs_mentioning

STEPS = 6


def _job(tmp_path: Path, name: str, *, relay: bool) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    ckpt = tmp_path / name / "ckpt"
    config = override(
        JobConfig(), sites=parse_sites("a:workers=2,shards=1;b:workers=2,shards=1"), relay=relay,
        train__steps=STEPS, train__eval_every=0, security__insecure=True, transport__idle_timeout_s=60.0,
        server__checkpoint_dir=str(ckpt), server__checkpoint_every_steps=STEPS,
    )  # fmt: skip
    summary = Launcher(config, run_dir=tmp_path / name / "run").run()
    out = tmp_path / name / "model.pt"
    assert main(["export", "--checkpoint-dir", str(ckpt), "--out", str(out)]) == 0
    return summary, torch.load(out)


@pytest.mark.slow
@pytest.mark.timeout(900)  # two jobs of 4 workers, 2 shards (and 2 relays) on 2 shared cores
def test_two_sites_of_two_workers_relay_and_train_as_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    relayed, with_relays = _job(tmp_path, "relays", relay=True)
    direct, without = _job(tmp_path, "direct", relay=False)
    assert relayed["steps"] == direct["steps"] == STEPS
    assert "relays" not in direct
    assert [(r["site"], r["worker_id"], r["ranks"], r["upstream_world"]) for r in relayed["relays"]] == [
        ("a", "relay-a", [0, 1], 2), ("b", "relay-b", [2, 3], 2)]  # fmt: skip
    assert json.loads((tmp_path / "relays" / "run" / "launch.json").read_text())["relays"] == ["relay-a", "relay-b"]
    assert with_relays.keys() == without.keys()
    for name, value in with_relays.items():  # per site then over sites: float addition reordered
        torch.testing.assert_close(value, without[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(v, load_task("digits-cnn").build_model().state_dict()[k]) for k, v in with_relays.items())
    model = 4 * sum(p.numel() for p in load_task("digits-cnn").build_model().parameters())
    for r in relayed["relays"]:
        # One fp32 model each way per step (both shards together), plus INIT (relay-a) and the first pull.
        assert r["error"] is None, r
        assert STEPS * model < r["wan_bytes_sent"] < (STEPS + 2) * model * 1.1, (r, model)
        assert STEPS * model < r["wan_bytes_received"] < (STEPS + 2) * model * 1.1, (r, model)
        assert [p["steps"] for p in r["phases"]] == [STEPS, STEPS], r  # each shard's site steps, timed
    # Without relays each worker moves its own model each way: the site's two, twice a relay's.
    assert direct["bytes_up"] > 1.5 * sum(r["wan_bytes_sent"] for r in relayed["relays"])
    assert not _procs_mentioning(str(tmp_path / "relays" / "run"))


class _KillsRelay(Launcher):
    """Kills the first relay as soon as the relays listen."""

    def _start_relays(self, cfg_path: Path, upstream: Any) -> Any:
        procs = super()._start_relays(cfg_path, upstream)
        procs[0].kill()
        procs[0].wait()
        return procs


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_relay_that_exits_early_fails_the_job_and_everything_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from netsense.errors import ProcessFailed

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = override(JobConfig(), sites=parse_sites("a:workers=2;b:workers=2"), train__steps=50, train__eval_every=0,
                      security__insecure=True, transport__idle_timeout_s=60.0)  # fmt: skip
    launcher = _KillsRelay(config, run_dir=tmp_path / "run")
    with pytest.raises(ProcessFailed, match=r"^the relay of site a exited early with status -9$"):
        launcher.run()
    assert all(p.poll() is not None for p in launcher.procs)
    assert not _procs_mentioning(str(tmp_path / "run"))

"""torchrun / Slurm environment parsing."""

from __future__ import annotations

import pytest

from netsense.errors import ConfigError
from netsense.launch.env import first_slurm_host, from_environ


def test_torchrun() -> None:
    e = from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29500"})
    assert (e.source, e.rank, e.world_size, e.local_rank, e.ps_host, e.ps_port) == ("torchrun", 3, 4, 1, "10.0.0.7", None)


def test_slurm() -> None:
    e = from_environ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[03-05,09]"})
    assert (e.source, e.rank, e.world_size, e.ps_host) == ("slurm", 5, 8, "gpu03")


def test_netsense_ps_overrides_and_none() -> None:
    e = from_environ({"NETSENSE_PS": "ps.example:5000", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x"})
    assert (e.ps_host, e.ps_port) == ("ps.example", 5000)
    assert from_environ({}).source == "none"


@pytest.mark.parametrize(("nodelist", "first"), [("node1", "node1"), ("a[1-3]", "a1"), ("gpu[007,9]", "gpu007"), ("x,y", "x")])
def test_first_slurm_host(nodelist: str, first: str) -> None:
    assert first_slurm_host(nodelist) == first


def test_bad_values() -> None:
    with pytest.raises(ConfigError, match="RANK"):
        from_environ({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="NETSENSE_PS"):
        from_environ({"NETSENSE_PS": "nohostport"})


def test_children_import_their_parents_netsense_from_any_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A child started in a folder holding another `netsense/` (a second checkout) imports the
    parent's netsense, not that folder's: `PYTHON` leaves the working directory off sys.path."""
    import subprocess

    import netsense
    from netsense.config import JobConfig
    from netsense.launch import PYTHON
    from netsense.launch.launcher import Launcher

    (tmp_path / "netsense").mkdir()
    (tmp_path / "netsense" / "__init__.py").write_text("raise SystemExit('the folder netsense was imported')\n")
    code = "import netsense; print(netsense.__file__)"
    out = subprocess.run([*PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == netsense.__file__, out
    bare = subprocess.run([PYTHON[0], "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "the folder netsense was imported" in bare.stderr  # what -P prevents
    assert Launcher(JobConfig(), run_dir=tmp_path / "run")._cmd("ps")[: len(PYTHON)] == list(PYTHON)


def test_children_share_the_cores_unless_told() -> None:
    """`netsense launch`'s children split this host's cores between them (one torch thread each on
    2 cores); the user's OMP_NUM_THREADS stands."""
    from netsense.launch.launcher import thread_env

    assert thread_env(4, env={}, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert thread_env(3, env={}, cores=16) == {"OMP_NUM_THREADS": "5"}
    assert thread_env(0, env={}, cores=2) == {"OMP_NUM_THREADS": "2"}
    assert thread_env(4, env={"OMP_NUM_THREADS": "3"}, cores=2) == {}

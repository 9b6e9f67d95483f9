"""Local launcher: S PS shards + N workers as separate processes on loopback, supervised.

With sites (`JobConfig.sites`), each child is told its site (``--site``) and, when a link is
emulated, only traffic between sites goes through it: a worker reaches its own site's shards
directly. A site of several workers gets a relay (`netsense.launch.relays`), which its workers
reach instead of the shards. Subclasses place each site elsewhere (`_spawn`'s ``site``, `_host`),
e.g. in a network namespace per site (`netsense bench scenario`).

Any child that fails stops the whole job (others are terminated, then killed after a grace
period); Ctrl-C does the same. Workers report progress as JSON lines on stdout, which drive the
progress bar and the summary.

Over 400 lines for a reason: every child (shards, emulators, relays, workers) is started, watched
and summarized from the one supervisor state here; the pure parts live in sites.py and relays.py.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

from netsense.config import JobConfig, override, to_dict, with_sites
from netsense.devcerts import check_cert_dates, ensure_certs
from netsense.errors import ProcessFailed
from netsense.launch import PYTHON
from netsense.launch.env import resolve_job_id
from netsense.launch.jsonout import strict_json
from netsense.launch.outputs import check_output_dir, check_output_file, shard_file
from netsense.launch.relays import RelayPlan, plan_relays, read_events, relay_args
from netsense.launch.shardcheck import check_shards
from netsense.launch.sites import format_sites, rank_sites, shard_sites
from netsense.models import check_model
from netsense.transport.emulation.linkspec import parse_link
from netsense.transport.emulation.traces import ConstantRate
from netsense.transport.tls import LOOPBACK_MAX_DATAGRAM_SIZE, TransportSettings
from netsense.worker.device import resolve_device

log = logging.getLogger(__name__)
_GRACE_S = 5.0
_T = TypeVar("_T")


def _reader(rank: int, stream: IO[str], out: queue.Queue[tuple[int, dict[str, Any]]]) -> None:
    for line in stream:
        line = line.strip()
        if line.startswith("{"):
            try:
                out.put((rank, json.loads(line)))
            except json.JSONDecodeError:
                log.debug("rank %d printed non-JSON: %s", rank, line)


def thread_env(processes: int, env: Mapping[str, str] | None = None, cores: int | None = None) -> dict[str, str]:
    """OMP_NUM_THREADS for `processes` children on this host: its cores shared out, at least one
    each (torchrun sets 1 for several processes per node), unless the user set it. Each torch
    process otherwise runs one intra-op thread per core, and their spinning threads oversubscribe
    the cores: the README's job took 29 s where one thread each took 14 (docs/BENCHMARKS.md, "The
    README's main job")."""
    env = os.environ if env is None else env
    if "OMP_NUM_THREADS" in env:
        return {}
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": str(max(1, cores // max(1, processes)))}


def stop_processes(procs: list[subprocess.Popen[str]], grace_s: float = _GRACE_S) -> None:
    """SIGTERM every live process, wait up to `grace_s`, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Launcher:
    """Runs one job locally; `run()` returns the summary dict."""

    def __init__(
        self,
        config: JobConfig,
        *,
        verbose: int = 0,
        on_event: Callable[[int, dict[str, Any]], None] | None = None,
        run_dir: str | Path | None = None,
        worker_args: list[str] | None = None,
        link: str | None = None,
        trace: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        self.config = config
        self.verbose = verbose
        self.on_event = on_event or (lambda rank, e: None)
        self._run_dir = Path(run_dir) if run_dir else None
        self.worker_args = worker_args or []
        self.link = link
        """Emulated link spec between the workers and the PS (`netsense emulate` child), or None."""
        self.trace = trace
        """Rate trace file for that link, or None."""
        self.metrics_port = metrics_port
        """First metrics port: shard i on +i, worker r on +servers+r; 0 = free ports; None = no metrics."""
        self.metrics_host = metrics_host
        """Address every metrics endpoint binds."""
        self.metrics_ports: dict[str, list[int]] = {"ps": [], "workers": []}
        """The ports the children reported, for the summary."""
        self.procs: list[subprocess.Popen[str]] = []
        self._thread_env: dict[str, str] = {}
        """What `_spawn` adds to each child's environment (`thread_env`), set once the count is known."""
        self.relays: list[dict[str, Any]] = []
        """Per relayed site: its plan's fields, the ports it serves and, once stopped, its WAN bytes."""
        self._checked = False

    @property
    def run_dir(self) -> Path:
        """The run folder: the one given, else a fresh temporary one, made on first use, so a
        launch that fails its checks (or a launcher only checked) leaves no empty folder behind."""
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="netsense-launch-"))
        return self._run_dir

    def _cmd(self, *args: str) -> list[str]:
        flags = ["-v"] * self.verbose
        return [*PYTHON, "-m", "netsense", *flags, *args]

    def _spawn(self, cmd: list[str], site: str | None = None) -> subprocess.Popen[str]:
        """Start one child; `site` is where it runs (None: the emulator, or a job without sites)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._thread_env}
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        return p

    def check(self) -> None:
        """What can be wrong before any process starts, as one `ConfigError` line: no GPU, a model
        that does not load (or its optimizer), a bad link spec or trace file, an expired
        certificate. `run()` calls it unless the caller did (the CLI does, before it draws its
        progress bar). Where the job will write is checked too (decision logs, checkpoints, the run
        folder), so a typo there is not a child's traceback once the PS runs."""
        config = with_sites(self.config)  # the workers and shards the sites make
        if self._run_dir is not None:  # a temporary one is made fresh, writable by construction
            check_output_dir("--run-dir", self._run_dir)
        check_output_dir("server.checkpoint_dir", config.server.checkpoint_dir)
        if config.train.decision_log:
            for rank in range(config.workers):
                check_output_file("train.decision_log (--decision-log)", self._up_log(rank))
        if config.server.decision_log:
            for shard in range(config.servers):
                check_output_file("server.decision_log", self._down_log(shard))
        resolve_device(config.train.device)
        check_shards(check_model(config.model, config.optimizer), config.model, config.servers)
        if self.link or self.trace:  # else the emulator's exit status would say it, after the PS started
            parse_link(self.link or "", trace=self.trace)
        if not config.security.insecure:
            check_cert_dates(ensure_certs(config.security.certs_dir, create=True))  # not a PS exit status later
        self._checked = True

    def run(self) -> dict[str, Any]:
        if not self._checked:
            self.check()
        config = with_sites(self.config)
        if config.transport.max_datagram_size == TransportSettings.max_datagram_size:
            # Everything runs on loopback: the WAN-safe 1200-byte default would waste most of the CPU.
            config = override(config, transport__max_datagram_size=LOOPBACK_MAX_DATAGRAM_SIZE)
        elif self.link or self.trace:
            # A size set for an emulated link is the link's packet: the emulator's port is on this host.
            config = override(config, transport__local_max_datagram_size=0)
        if not config.security.insecure:
            certs = ensure_certs(config.security.certs_dir, create=True)  # checked in `check()`
            config = override(config, security__certs_dir=str(certs.ca.parent))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "launch.json").write_text(
            json.dumps({"link": self.link, "trace": self.trace, "workers": config.workers, "servers": config.servers,
                        "sites": format_sites(config.sites) or None,
                        "relays": [p.worker_id for p in plan_relays(config)] or None})
        )  # what `netsense plot RUN_DIR` needs to draw the link's true rate
        # One id for the whole job, so a long-lived PS tells this run from an earlier one.
        job = resolve_job_id(config.model, config.train.seed, config.train.job_id, random_part=True)
        config = override(config, train__job_id=job, **_absolute_tables(config))
        self.config = config
        cfg_path = self.run_dir / "config.json"
        cfg_path.write_text(json.dumps(to_dict(override(config, server__host="127.0.0.1", server__port=0)), indent=2))
        try:
            return self._supervise(cfg_path, config.workers)
        finally:
            stop_processes(self.procs)

    def _host(self, site: str | None) -> str:
        """The address at which the shards of `site` listen and are reached."""
        return "127.0.0.1"

    def _supervise(self, cfg_path: Path, n: int) -> dict[str, Any]:
        servers = self.config.servers
        shard_site: list[str | None] = list(shard_sites(self.config.sites)) or [None] * servers
        rank_site: list[str | None] = list(rank_sites(self.config.sites)) or [None] * n
        down_logs = [self._down_log(i) for i in range(servers)]
        emulated_paths = servers if self.link or self.trace else 0
        self._thread_env = thread_env(servers + n + len(plan_relays(self.config)) + emulated_paths)
        if self._thread_env:
            log.info("each child runs %s torch thread(s) (OMP_NUM_THREADS; set it to override)", self._thread_env["OMP_NUM_THREADS"])
        shards = []
        for i in range(servers):
            args = ["ps", "--config", str(cfg_path), "--decision-log", down_logs[i], *self._metrics_args(i)]
            if shard_site[i] is not None:
                args += ["--site", str(shard_site[i]), "--host", self._host(shard_site[i])]
            ckpt = self.config.server.checkpoint_dir
            if ckpt and servers > 1:
                args += ["--checkpoint-dir", str(Path(ckpt) / f"shard-{i}")]  # each shard checkpoints alone
            if ckpt and self.config.train.resume:
                args += ["--resume"]  # the shards restart from their checkpoints; the workers ask to resume
            shards.append(self._spawn(self._cmd(*args), shard_site[i]))
        ports = [self._wait_ready(ps) for ps in shards]
        direct = [f"{self._host(shard_site[i])}:{p}" for i, p in enumerate(ports)]
        emulated = list(direct)
        emulators = []
        if self.link or self.trace:
            for i, p in enumerate(ports):  # one emulated path per shard connection
                emulator, port = self._start_emulator(p)
                emulated[i] = f"127.0.0.1:{port}"
                emulators.append(emulator)

        def upstream(here: str | None) -> list[str]:
            # With sites, only the shards of other sites are behind the emulated link.
            return [d if here is not None and shard_site[i] == here else e for i, (d, e) in enumerate(zip(direct, emulated))]

        relays = self._start_relays(cfg_path, upstream)
        relay_of = {r: ",".join(f"{self._host(x['site'])}:{p}" for p in x["ports"]) for x in self.relays for r in x["ranks"]}
        site_policy = {r: p.site_policy for p in plan_relays(self.config) for r in p.ranks if p.site_policy}
        events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        workers = []
        for rank in range(n):
            here = rank_site[rank]
            ps_arg = relay_of.get(rank) or ",".join(upstream(here))  # a relayed site's workers reach only its relay
            site_args = ["--site", here] if here is not None else []
            w = self._spawn(
                self._cmd(
                    "worker", "--config", str(cfg_path), "--ps", ps_arg, "--rank", str(rank),
                    "--world-size", str(n), "--worker-id", f"worker-{rank}", "--events",
                    "--server-name", "127.0.0.1", "--decision-log", self._up_log(rank),
                    *site_args, *self._metrics_args(servers + rank), *self.worker_args,
                    *(["--policy", site_policy[rank]] if rank in site_policy else []),
                ),
                here,
            )  # fmt: skip
            threading.Thread(target=_reader, args=(rank, w.stdout, events), daemon=True).start()
            workers.append(w)
        done: dict[int, dict[str, Any]] = {}
        event_log = (self.run_dir / "events.jsonl").open("a")  # every worker event, for replay and plots
        try:
            self._watch(events, event_log, done, shards, emulators, workers, servers, relays)
        finally:
            event_log.close()
        self._stop_relays(relays)
        missing = [r for r in range(n) if r not in done]
        if missing:
            raise ProcessFailed(f"workers {missing} exited without a summary")
        return self._summary(done, n, servers, down_logs)

    def _watch(
        self,
        events: queue.Queue[tuple[int, dict[str, Any]]],
        event_log: IO[str],
        done: dict[int, dict[str, Any]],
        shards: list[subprocess.Popen[str]],
        emulators: list[subprocess.Popen[str]],
        workers: list[subprocess.Popen[str]],
        servers: int,
        relays: list[subprocess.Popen[str]] | None = None,
    ) -> None:
        """Forward events until every worker exits 0; raise at the first process that fails."""
        restarted = False  # the emulators' traces, when training starts (`_restart_traces`)
        while True:
            try:
                rank, event = events.get(timeout=0.2)
                if event.get("event") == "done":
                    done[rank] = event
                elif event.get("event") == "metrics":
                    self.metrics_ports["workers"].append(int(event["port"]))
                event_log.write(strict_json({"t": time.time(), "rank": rank, **event}) + "\n")
                if event.get("event") in ("start", "step") and emulators and not restarted:
                    restarted = True
                    self._restart_traces(emulators)
                self.on_event(rank, event)
            except queue.Empty:
                pass
            for i, ps in enumerate(shards):
                if ps.poll() is not None:
                    shard = f" (shard {i})" if servers > 1 else ""
                    raise ProcessFailed(f"the parameter server{shard} exited early with status {ps.returncode}")
            for info, relay in zip(self.relays, relays or []):
                if relay.poll() is not None:
                    raise ProcessFailed(f"the relay of site {info['site']} exited early with status {relay.returncode}")
            for emulator in emulators:
                if emulator.poll() is not None:
                    raise ProcessFailed(f"the link emulator exited early with status {emulator.returncode}")
            codes = [w.poll() for w in workers]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                raise ProcessFailed(f"worker {failed[0][0]} exited with status {failed[0][1]}; stopped the job")
            if all(c == 0 for c in codes) and events.empty():
                return

    def _summary(self, done: dict[int, dict[str, Any]], n: int, servers: int, down_logs: list[str]) -> dict[str, Any]:
        first = done[0]
        return {
            "test_accuracy": first["test_accuracy"],
            "final_loss": first["final_loss"],
            "wall_s": first["wall_s"],
            "steps": first["steps"],
            "samples_per_s": first["samples_per_s"],
            "bytes_up": sum(d["bytes_up"] for d in done.values()),
            "bytes_down": sum(d["bytes_down"] for d in done.values()),
            "workers": n,
            "servers": servers,
            "device": first.get("device", "cpu"),
            "levels": _merge_levels(d.get("levels", {}) for d in done.values()),
            **({"sites": self._site_summary()} if self.config.sites else {}),
            **({"relays": [{k: v for k, v in x.items() if k != "events"} for x in self.relays]} if self.relays else {}),
            # the logs written: a gradient-domain PS runs no downlink policy, so it writes none
            "decision_logs": [p for p in (*down_logs, *(self._up_log(r) for r in range(n))) if Path(p).exists()],
            **({"metrics_ports": self.metrics_ports} if self.metrics_port is not None else {}),
        }

    def _site_summary(self) -> list[dict[str, Any]]:
        """Per site: its ranks and shard indices (where each process ran)."""
        ranks, shards = rank_sites(self.config.sites), shard_sites(self.config.sites)
        return [
            {"name": s.name, "ranks": [r for r, x in enumerate(ranks) if x == s.name],
             "shards": [i for i, x in enumerate(shards) if x == s.name]}
            for s in self.config.sites
        ]  # fmt: skip

    def _start_relays(self, cfg_path: Path, upstream: Callable[[str | None], list[str]]) -> list[subprocess.Popen[str]]:
        """One `netsense relay` per relayed site (`plan_relays`), each reaching every shard as that
        site's workers would; returns them once each listens (their ports in `self.relays`)."""
        procs = []
        for plan in plan_relays(self.config):
            args = relay_args(plan, config_path=str(cfg_path), upstream=upstream(plan.site), host=self._host(plan.site),
                              job_id=self.config.train.job_id or "", decision_log=self._relay_log(plan.site))  # fmt: skip
            proc = self._spawn(self._cmd(*args), plan.site)
            box: queue.Queue[dict[str, Any]] = queue.Queue()
            reader = threading.Thread(target=read_events, args=(proc.stdout, box), daemon=True)
            reader.start()
            ports: list[int] = []

            def port_of(event: dict[str, Any], ports: list[int] = ports) -> int | None:
                if event.get("event") != "ready":
                    return None
                ports.extend(int(p) for p in event["ports"])
                return ports[0]

            _await_port(box, proc, port_of, what=f"the relay of site {plan.site}", report="ready", timeout_s=60.0)
            logged = {"decision_log": self._relay_log(plan.site)} if plan.upstream_policy is not None else {}
            self.relays.append({**_plan_fields(plan), **logged, "ports": ports, "events": (box, reader)})
            procs.append(proc)
        return procs

    def _stop_relays(self, relays: list[subprocess.Popen[str]]) -> None:
        """Stop the relays before the shards they push to, and note each one's WAN bytes from its
        ``stopped`` line."""
        stop_processes(relays)
        for info in self.relays:
            box, reader = info.pop("events")
            reader.join(timeout=_GRACE_S)
            while not box.empty():
                event = box.get()
                if event.get("event") == "stopped":
                    info.update(wan_bytes_sent=event.get("wan_bytes_sent"), wan_bytes_received=event.get("wan_bytes_received"),
                                error=event.get("error"), **({"levels": event["levels"]} if "levels" in event else {}),
                                **({"phases": event["phases"]} if "phases" in event else {}))  # fmt: skip

    def _metrics_args(self, index: int) -> list[str]:
        """Metrics flags of child `index` (shards first, then workers): base port + index, or 0 for 0."""
        if self.metrics_port is None:
            return []
        port = self.metrics_port + index if self.metrics_port else 0
        return ["--metrics-port", str(port), "--metrics-host", self.metrics_host]

    def _down_log(self, shard: int) -> str:
        """Shard `shard`'s downlink decision log (the plain name when there is one shard)."""
        configured = self.config.server.decision_log
        return shard_file(configured or self.run_dir / "decisions-down.jsonl", shard, self.config.servers)

    def _relay_log(self, site: str) -> str:
        """The decision log of site `site`'s relay when its push adapts (the run dir's)."""
        return str(self.run_dir / f"decisions-relay-{site}.jsonl")

    def _up_log(self, rank: int) -> str:
        """Worker `rank`'s uplink decision log: the configured path with the rank, or the run dir's."""
        configured = self.config.train.decision_log
        if configured:
            path = Path(configured)
            return str(path.with_name(f"{path.stem}-{rank}{path.suffix or '.jsonl'}"))
        return str(self.run_dir / f"decisions-up-{rank}.jsonl")

    def _restart_traces(self, emulators: list[subprocess.Popen[str]]) -> None:
        """Restart a time-varying link at its time 0 (SIGUSR1 to `netsense emulate`), once, when the
        first worker reports `start` (its training loop begins; a worker without that event: its
        first step): the trace's clock ran from the emulator's start, so a run whose set-up took
        seconds longer met it in another phase (on the matrix's looping step link, netsense's first
        steps fell in the 10 Mbit/s phase where fixed powersgd:2's fell in the 50 Mbit/s one).
        At the first step was too late: netsense's first update, 1-1.7 s, still crossed the old
        phase. Constant links are left alone."""
        rate = parse_link(self.link or "", trace=self.trace).up.rate
        if rate is None or isinstance(rate, ConstantRate):
            return
        for emulator in emulators:
            if emulator.poll() is None:
                emulator.send_signal(signal.SIGUSR1)

    def _start_emulator(self, ps_port: int, timeout_s: float = 30.0) -> tuple[subprocess.Popen[str], int]:
        """`netsense emulate` between the workers and the PS; returns it and the port it listens on."""
        args = ["emulate", "--upstream", f"127.0.0.1:{ps_port}", "--stats-every", "0", "--link", self.link or ""]
        if self.trace:
            args += ["--trace", self.trace]
        emu = self._spawn(self._cmd(*args))
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert emu.stdout is not None
            for line in emu.stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

        def port_of(line: str) -> int | None:
            return int(line.split()[2].rpartition(":")[2]) if line.startswith("listening on ") else None

        return emu, _await_port(lines, emu, port_of, what="the link emulator", report="its port", timeout_s=timeout_s)

    def _wait_ready(self, ps: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=_reader, args=(-1, ps.stdout, _Adapter(box)), daemon=True).start()

        def port_of(event: dict[str, Any]) -> int | None:
            if event.get("event") != "ready":
                return None
            if "metrics_port" in event:
                self.metrics_ports["ps"].append(int(event["metrics_port"]))
            return int(event["port"])

        return _await_port(box, ps, port_of, what="the parameter server", report="ready", timeout_s=timeout_s)


def _await_port(
    box: queue.Queue[_T],
    proc: subprocess.Popen[str],
    port_of: Callable[[_T], int | None],
    *,
    what: str,
    report: str,
    timeout_s: float,
) -> int:
    """The port that a starting child announces through `box` (`port_of` is None for other lines).

    One wait for the PS and the emulator alike: a child that exits first, or stays silent past
    `timeout_s`, fails the job with ProcessFailed instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            item = box.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                raise ProcessFailed(f"{what} exited with status {proc.returncode} before listening")
            continue
        port = port_of(item)
        if port is not None:
            return port
    raise ProcessFailed(f"{what} did not report {report} within {timeout_s} s")


def _plan_fields(plan: RelayPlan) -> dict[str, Any]:
    return {"site": plan.site, "worker_id": plan.worker_id, "ranks": list(plan.ranks),
            "upstream_world": plan.upstream_world, "upstream_codec": plan.upstream_codec,
            "upstream_policy": plan.upstream_policy}  # fmt: skip


def _merge_levels(histograms: Any) -> dict[str, int]:
    """Sum of per-worker level histograms (codec spec -> steps)."""
    total: dict[str, int] = {}
    for h in histograms:
        for spec, count in h.items():
            total[spec] = total.get(spec, 0) + int(count)
    return total


class _Adapter:
    """Lets `_reader` feed a queue of bare events (the PS has no rank)."""

    def __init__(self, box: queue.Queue[dict[str, Any]]) -> None:
        self.box = box

    def put(self, item: tuple[int, dict[str, Any]]) -> None:
        self.box.put(item[1])


def _absolute_tables(config: JobConfig) -> dict[str, str]:
    """The progress tables' paths made absolute: the children may run elsewhere (a site's netns
    shares the file system, not necessarily the working folder)."""
    out = {}
    for field, path in (("train__progress_table", config.train.progress_table), ("server__progress_table", config.server.progress_table)):
        if path is not None:
            out[field] = str(Path(path).resolve())
    return out

"""`NetSenseOptimizer`: the PyTorch-native API. ``loss.backward(); opt.step()`` trains through the PS.

It is a `torch.optim.Optimizer` whose param groups hold the PS optimizer's hyper-parameters: LR
schedulers, `GradScaler` (worker/amp.py) and `state_dict` work on them as on any optimizer, and
each step's values travel with its pushes (worker/hparams.py). `step()` encodes each key's
gradient (worker/encoding.py, with error feedback for lossy codecs), hands the buckets to the
exchange (worker/exchange.py), which pushes them on parallel QUIC streams and waits for the next
version on the network thread, and writes that version into the model in place
(worker/replica.py). This class is the public API and the training-thread side of a step; all
network-side state lives in the `Exchange`. (Over 400 lines because a step is one sequence:
encode, push, redecide, apply, account; the pieces that stand alone are in the modules named.)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import torch

from netsense.compression import Payload, make_codec
from netsense.compression.feedback import ErrorFeedback
from netsense.compression.policy import Decision, Policy, build_policy
from netsense.compression.policy.link import LinkState
from netsense.errors import ConfigError, NetSenseError
from netsense.transport.hparams import scales_per_coordinate

from .amp import scaler_verdict, unscale
from .client import PSClient, StepFields
from .connect import ConnectSettings
from .duplex import duplex_blocker
from .encoding import GradientEncoder, bucketize, sent_window_for
from .exchange import Exchange, StepResult
from .hparams import check_groups, group_defaults, optimizer_name, step_fields
from .layout import DEFAULT_CHUNK_ELEMS, KeySlot
from .overlap import BackwardPushes, BucketReply, slots_by_param
from .redecide import Redecided, redecide_after
from .replica import Replica
from .uplink import UplinkController

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    """What one `step()` cost, for progress and benchmarks (the per-step breakdown)."""

    version: int = 0
    compute_s: float = 0.0
    """Since the previous `step()` returned: forward/backward and the data loader (0 on the first)."""
    encode_s: float = 0.0
    """Policy choice and encoding (with error feedback) of every key."""
    wire_s: float = 0.0
    """Push + pull on every shard: first push byte to the last PARAMS (includes `wait_s`)."""
    push_s: float = 0.0
    """First push byte to the last push's ack, on the slowest shard."""
    wait_s: float = 0.0
    """After the last push ack until the PARAMS arrived: the barrier (other workers) and the downlink."""
    decode_s: float = 0.0
    """Decoding the PARAMS payloads."""
    apply_s: float = 0.0
    """Writing the decoded parameters into the model (excludes `decode_s`)."""
    bytes_up: int = 0
    bytes_down: int = 0
    codec: str = ""
    early_buckets: int = 0
    """Overlap: buckets pushed from gradient hooks during backward, before `step()` was called."""
    staleness: int = 0
    """Async PS (SSP): updates applied between the version this step's gradient was computed on
    and its own update (the largest over shards); always 0 against a synchronous PS."""
    skipped: bool = False
    """The AMP grad scaler found Inf/NaN: this worker sent no gradient and sat the step out."""
    nonfinite: int = 0
    """Keys whose local gradient held NaN or inf: pushed as zero (the residual only) this step."""
    clamped: int = 0
    """Values sent clamped to a 16-bit type's finite range this step (error feedback keeps the rest)."""


class NetSenseOptimizer(torch.optim.Optimizer):
    """A `torch.optim.Optimizer` for data-parallel training via a NetSense PS.

    `connect` is one PS or a list of PS shards: keys are spread over the shards by
    `assign_shards` (size-balanced, deterministic), each shard gets only its keys, and a step
    pushes to and pulls from every shard in parallel. The PS holds the optimizer (``optimizer`` settings are sent by rank 0 at start); this object
    only moves gradients up and parameters down. Rank 0's initial parameters win: other ranks
    are overwritten with them at construction.

    ``overlap=True`` pushes keys from gradient hooks during backward (`worker/overlap.py`) and,
    against a sync PS, pulls each bucket's keys as soon as the PS applied them: full duplex, bit for
    bit the plain step's result. ``overlap=None`` turns it on wherever that holds and the policy needs
    no redecide (`worker/duplex.py`; the training loop's default); the API's default stays off,
    since a caller may accumulate gradients over several backwards or scale them (GradScaler). Pushes
    need the batch's sample count, which is the last `step()`'s unless ``zero_grad(samples=n)``
    says otherwise (the first step without it is not overlapped). One backward per step: the
    hooks would push the first of several accumulated backwards.

    ``params`` are torch-style param groups (default: every trainable parameter, one group) and
    must cover the model's trainable parameters exactly; group defaults come from ``optimizer``.
    Each step's group hyper-parameters (lr, momentum or betas, weight decay, eps) go to the PS
    with the pushes and apply to that step, so every stock LR scheduler works. `state_dict` holds
    the groups; the optimizer's moments live on the PS (and in its checkpoints).
    """

    _step_supports_amp_scaling = True
    """GradScaler then always calls `step()` (worker/amp.py): a skipped step still meets the barrier."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        connect: ConnectSettings | Sequence[ConnectSettings],
        rank: int = 0,
        world_size: int = 1,
        worker_id: str | None = None,
        optimizer: dict[str, object] | None = None,
        codec: str = "fp32",
        chunk_elems: int = DEFAULT_CHUNK_ELEMS,
        bucket_bytes: int = 4 << 20,
        policy: str | Policy | None = None,
        ladder: str | None = None,
        decision_log: str | os.PathLike[str] | None = None,
        policy_settings: dict[str, object] | None = None,
        overlap: bool | None = False,
        overlap_bucket_bytes: int = 1 << 20,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]] | None = None,
    ) -> None:
        self.model = model
        settings = dict(optimizer or {})
        self._optimizer_name = optimizer_name(settings)
        super().__init__(params if params is not None else [p for p in model.parameters() if p.requires_grad], group_defaults(settings))
        shards = [connect] if isinstance(connect, ConnectSettings) else list(connect)
        self._replica = Replica(model, chunk_elems, len(shards))
        check_groups(self.param_groups, self.slots)
        self._early_fields: StepFields | None = None  # overlap: what the hooks' pushes carry
        self.rank = rank
        self.world_size = world_size
        self.codec_spec = codec
        make_codec(codec)  # fail fast on a bad spec
        # `--codec X` is `--policy fixed:X`; a policy given explicitly wins over the codec.
        self.uplink = UplinkController(
            build_policy(policy or f"fixed:{codec}", ladder, policy_settings),
            payload_bytes=sum(4 * s.numel for s in self.slots),
            decision_log=decision_log,
            log_fields={"worker_id": worker_id, "rank": rank},
            pads=True,  # `Exchange.start_step` sends a decision's filler beside its pushes
            precondition=scales_per_coordinate(self._optimizer_name),
        )
        """Per-step level choice and the decision log (docs/POLICIES.md)."""
        self._encoder = GradientEncoder(
            self.slots, self.uplink, version=lambda: self._replica.version, sent_window=sent_window_for(sum(s.numel for s in self.slots), self.uplink)
        )
        self.bucket_bytes = bucket_bytes
        self.overlap_bucket_bytes = overlap_bucket_bytes
        """Bucket size of the pushes sent from hooks: smaller than `bucket_bytes`, so the first push
        leaves early in backward (a 4 MiB bucket held the whole 4 MB test MLP until backward ended)."""
        self.last = StepStats()
        self.bytes_up = 0
        self.bytes_down = 0
        self._step_end: float | None = None
        self._backward: BackwardPushes | None = None  # what this backward's hooks encoded and pushed
        self._next_samples: int | None = None
        self._param_slots = slots_by_param(self.slots)
        redecides = type(self.uplink.policy).redecide is not Policy.redecide
        self._exchange = Exchange(
            shards,
            self._replica,
            self.uplink,
            worker_id=worker_id or f"{socket.gethostname()}-{os.getpid()}-r{rank}",
            rank=rank,
            world_size=world_size,
            optimizer=optimizer or {},
            overlap=bool(overlap),
            # A redecided push withdraws what is not sent whole: a held push to this site's shard
            # would be re-encoded with the far ones', so such policies push every shard at once.
            wan_first=not redecides,
        )
        if self._exchange.start_probe is not None:  # taken while connecting (`Exchange._start`)
            sent, seconds, what = self._exchange.start_probe
            self.uplink.observe_probe(bytes_sent=sent, comm_s=seconds, link=self._exchange.read_link(), source=what)
        self._redecides = redecides
        """The policy may redecide a slow push (else waiting for it to be slow is a crossing for nothing)."""
        self.duplex_off: str | None = None
        """With ``overlap=None``: why the step stayed half duplex (None: it is full duplex, or overlap was given)."""
        self._auto_duplex = overlap is None  # the first full-duplex step may still turn it off (`_check_duplex`)
        if overlap is None:
            self.duplex_off = duplex_blocker(
                asynchronous=any(c.welcome is not None and c.welcome.staleness >= 0 for c in self._exchange.clients),
                redecides=self._redecides,
            )
            overlap = self.duplex_off is None
            log.info("full-duplex step %s", "on" if overlap else f"off: {self.duplex_off} (--overlap forces it)")
        self.overlap = overlap
        """Push keys from gradient hooks during backward and, against a sync PS, pull each bucket's
        keys as soon as they are applied (see `worker/overlap.py`)."""
        self._exchange.overlap = overlap
        self._hooks = (
            [s.param.register_post_accumulate_grad_hook(self._grad_ready) for s in self.slots if s.start == 0] if overlap else []
        )
        self.uplink.ready()  # connected, first parameters in: the caller's step 0 computes from here

    # --- public ----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Replica version: the lowest of the shards' versions (in sync mode all advance together)."""
        return self._replica.version

    @property
    def versions(self) -> list[int]:
        """Version of each shard's keys in this replica."""
        return self._replica.versions

    @property
    def slots(self) -> list[KeySlot]:
        """The PS keys of the model, in layout order."""
        return self._replica.slots

    @property
    def owner(self) -> dict[str, int]:
        """Key -> index of the PS shard that owns it (the same on every worker)."""
        return self._replica.owner

    @property
    def feedback(self) -> ErrorFeedback | None:
        """Error feedback's residuals; None until the first lossy step."""
        return self._encoder.feedback

    @property
    def nonfinite_keys(self) -> int:
        """Keys pushed as zero because their local gradient held NaN or inf, since the start."""
        return self._encoder.nonfinite

    @property
    def clamped_values(self) -> int:
        """Values sent clamped to a 16-bit type's finite range, since the start."""
        return self._encoder.clamped

    @property
    def clients(self) -> list[PSClient]:
        """One connection per PS shard."""
        return self._exchange.clients

    @property
    def client(self) -> PSClient:
        """The first shard's connection."""
        return self._exchange.clients[0]

    @property
    def reconnects(self) -> int:
        """Connections re-established after a drop (PS restart, path change, timeout)."""
        return self._exchange.reconnects

    def zero_grad(self, set_to_none: bool = True, *, samples: int | None = None) -> None:
        """Clear the gradients; with overlap, `samples` is the coming batch's size (default: the
        last step's), which the pushes sent during backward carry."""
        self.model.zero_grad(set_to_none=set_to_none)
        if samples is not None:
            self._next_samples = samples

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, *, samples: int = 1, codec: str | None = None) -> Any:  # type: ignore[override]
        """Push this worker's gradients (from `samples` samples), pull and apply the next version.

        The codec is `codec` when given, else the uplink policy's choice for this step. Returns
        the step's `StepStats` (also in `last`), or, given a `closure` (torch's contract: it
        recomputes the loss, with backward), the closure's loss."""
        if closure is not None and not callable(closure):
            raise ConfigError(f"step({closure!r}): the first argument is a closure; pass the batch size as step(samples=n)")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stats = self._step(samples, codec)
        return loss if closure is not None else stats

    def _step(self, samples: int, codec: str | None) -> StepStats:
        t0 = time.perf_counter()
        early, self._backward = self._backward, None  # overlap: what the gradient hooks already did
        scale, found_inf = scaler_verdict(self)
        if early is not None and (scale is not None or found_inf):
            raise ConfigError("GradScaler with overlap=True: the gradient hooks pushed scaled gradients; use overlap=False with AMP")
        if found_inf or (scale is not None and not unscale(self.param_groups, scale)):
            return self._skip(samples, t0)
        fields = self._step_fields()
        if early is not None:
            if self._early_fields is not None and self._early_fields.hparams != fields.hparams:
                raise ConfigError(
                    "the param groups changed between backward and step() with overlap=True: the pushes sent "
                    f"during backward carry {self._early_fields.hparams}, the groups now hold {fields.hparams}"
                )
            if codec is not None and codec != early.spec:
                raise ConfigError(f"step(codec={codec!r}) with overlap=True: the hooks already encoded with {early.spec!r}")
            if early.samples is not None and early.samples != samples:
                raise ConfigError(
                    f"step(samples={samples}) but the pushes sent during backward carry {early.samples}: "
                    "with overlap=True call zero_grad(samples=n) before backward when the batch size changes"
                )
            decision, spec = early.decision, early.spec
        else:
            decision = None
            if codec is None:
                self._probe_path()
                link = self._exchange.read_link()
                # The candidate round (every `progress_every` steps) runs before the choice it
                # informs and before the push leaves: on the wire, the network thread contends for
                # the GIL at every torch call of a round (the rate-step test measured an fp16 cast
                # of 65k elements at ~20 ms, which priced fp16 and qsgd:8 out of the law for 50
                # steps). Its time is the choice's, not the chosen level's encode cost.
                self._encoder.measure_candidates()
                decision = self._choose(link, t0)
            spec = codec or (decision.spec if decision is not None else self.codec_spec)
        self._next_samples = samples
        stats = StepStats(codec=spec)
        payloads: dict[str, Payload] = dict(early.payloads) if early is not None else {}
        # What each payload stands for, kept while the policy may re-encode the push mid-flight.
        sources: dict[str, torch.Tensor] | None = (
            {} if self._redecides and redecide_after(decision) is not None and early is None else None
        )
        self._encoder.encode_rest(spec, payloads, sources)
        codec_s = self._encoder.take_codec_s()  # this step's keys, in the hooks (overlap) and here
        buckets = self._shard_buckets(payloads, early)
        t1 = time.perf_counter()
        self._set_fields(fields)
        pad = decision.pad_bytes if decision is not None else 0
        pending = self._exchange.start_step(
            buckets, samples, early.futures if early else None, early.push_started if early else None, pad_bytes=pad
        )
        if decision is not None:
            self._encoder.track_progress(decision.level, spec)  # while the push is on the wire
        result, redecided = self._wait(pending, t1, decision, sources, payloads)
        if redecided is not None:
            stats.codec = redecided.spec
        t2 = time.perf_counter()
        decode_s = 0.0
        self._replica.own = payloads  # as pushed (a redecided push's re-encoding included)
        for shard, p in enumerate(result.params):
            decode_s += self._replica.apply(p, shard)
        t3 = time.perf_counter()
        stats.version, stats.staleness = self.version, result.staleness
        stats.nonfinite, stats.clamped = self._encoder.take_counts()
        stats.early_buckets = sum(len(f) for f in early.futures) if early is not None else 0
        stats.encode_s, stats.wire_s = t1 - t0 + (early.encode_s if early else 0.0), t2 - t1
        comm_s, step_encode_s = result.push_s, stats.encode_s
        if redecided is not None:  # the re-encoding counts as encoding; the withdrawn push's time does not
            stats.encode_s += redecided.encode_s
            stats.wire_s -= redecided.encode_s
            comm_s = max(0.0, t1 + result.push_s - redecided.pushed_at)
            step_encode_s, codec_s = redecided.encode_s, self._encoder.take_codec_s()
        stats.compute_s = t0 - self._step_end if self._step_end is not None else 0.0
        stats.push_s, stats.wait_s = result.push_s, max(0.0, stats.wire_s - result.push_s)
        stats.decode_s, stats.apply_s = decode_s, max(0.0, t3 - t2 - decode_s)
        sent, received = self._exchange.traffic()
        stats.bytes_up, stats.bytes_down = sent - self.bytes_up, received - self.bytes_down
        self.bytes_up, self.bytes_down = sent, received
        if decision is not None:
            self.uplink.observe(
                bytes_sent=sum(p.wire_size for p in payloads.values()) + pad,
                pad_bytes=pad,
                comm_s=comm_s,
                encode_s=step_encode_s,
                codec_s=codec_s,
                wire_s=stats.wire_s,
                version=self.version,
                returned=result.delivered,
                update_decode_s=decode_s if self._replica.step_spec in (None, stats.codec) else None,
            )
        self.uplink.mark_end()
        if self._auto_duplex and early is not None:
            self._check_duplex(payloads)
        self.last = stats
        self._step_end = time.perf_counter()
        return stats

    def _check_duplex(self, payloads: dict[str, Payload]) -> None:
        """``overlap=None``, after the first full-duplex step: if every shard's step fits in one hook
        bucket, its one push leaves when backward ends and its pull waits for all of it, as in the
        plain step, which then does the same with less work (measured: docs/BENCHMARKS.md), so the
        hooks go. Either step gives the same parameters bit for bit."""
        self._auto_duplex = False
        shard_bytes = [0] * len(self._replica.shard_slots)
        for key, p in payloads.items():
            if key in self.owner:
                shard_bytes[self.owner[key]] += p.wire_size
        if max(shard_bytes) > self.overlap_bucket_bytes:
            return
        self.duplex_off = f"each shard's step is one bucket of <= {self.overlap_bucket_bytes} bytes: nothing to pipeline"
        log.info("full-duplex step off: %s", self.duplex_off)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.overlap = self._exchange.overlap = False

    def close(self) -> None:
        """Leave the job (BYE) and stop the network thread."""
        if self._exchange.closed:
            return
        for hook in self._hooks:
            hook.remove()
        try:
            self._exchange.close()
        finally:
            self.uplink.close()

    def __enter__(self) -> NetSenseOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------

    def _choose(self, link: LinkState, started: float) -> Decision:
        """The uplink policy's level for this step; against gradient-domain shards it goes down at
        that level too, so the policy prices its bytes twice (`Policy.passes`) and, unless they
        forward the pushes (`Replica.forwarded`), two compressions (`Policy.compressions`); the level
        the step came down at is netsense's anchor (`Policy.step_spec`)."""
        policy, gradient = self.uplink.policy, self._replica.gradient_domain
        policy.passes = 2 if gradient else 1
        policy.compressions = 2 if gradient and not self._replica.forwarded else 1
        policy.step_spec = self._replica.step_spec if gradient else None
        policy.step_intents = self._replica.step_intents if gradient else ()
        policy.join_compressions = 1 if self._replica.forwards else policy.compressions
        return self.uplink.choose(link, started=started)

    def _step_fields(self, *, skip: bool = False) -> StepFields:
        return step_fields(self._optimizer_name, self.param_groups, self.slots, skip=skip)

    def _set_fields(self, fields: StepFields) -> None:
        """The PUSH fields of the step about to start, on every shard's client (read on the network
        thread only by the pushes submitted after this), with where the uplink policy is heading
        now that it has decided (`Push.intent`)."""
        fields = replace(fields, intent=self.uplink.policy.intent() or "")
        for client in self._exchange.clients:
            client.step_fields = fields
        self._replica.hparams, self._replica.key_groups = fields.hparams, fields.key_groups  # a gradient-domain update steps with them

    def _skip(self, samples: int, t0: float) -> StepStats:
        """The scaler found Inf/NaN: a skip PUSH to every shard (no gradient; the barrier counts
        this worker done and averages the others), then the step's PARAMS as usual. Error
        feedback keeps its residuals: nothing of this gradient was sent."""
        self._set_fields(self._step_fields(skip=True))
        t1 = time.perf_counter()
        result = self._exchange.start_step([[{}] for _ in self._replica.shard_slots], samples).result()
        t2 = time.perf_counter()
        self._replica.own = {}
        decode_s = sum(self._replica.apply(p, shard) for shard, p in enumerate(result.params))
        stats = StepStats(version=self.version, codec="", skipped=True, encode_s=t1 - t0, wire_s=t2 - t1, decode_s=decode_s)
        stats.compute_s = t0 - self._step_end if self._step_end is not None else 0.0
        sent, received = self._exchange.traffic()
        stats.bytes_up, stats.bytes_down = sent - self.bytes_up, received - self.bytes_down
        self.bytes_up, self.bytes_down = sent, received
        self._next_samples = samples
        self.uplink.mark_end()
        self.last = stats
        self._step_end = time.perf_counter()
        return stats

    def _shard_buckets(self, payloads: dict[str, Payload], early: BackwardPushes | None) -> list[list[dict[str, Payload]]]:
        """Each shard's buckets; with overlap, the ones pushed from hooks first (their futures pair
        with them), then the rest."""
        shard_slots = self._replica.shard_slots
        if early is None:
            buckets = [bucketize({s.key: payloads[s.key] for s in slots}, self.bucket_bytes) for slots in shard_slots]
            buckets[0][0].update(self._replica.state_payloads(0))  # buffers ride with gradients (never alone: no race)
            return buckets
        sent = {k for shard in early.sent for b in shard for k in b}
        buckets = [
            early.sent[i] + bucketize({s.key: payloads[s.key] for s in slots if s.key not in sent}, self.bucket_bytes)
            for i, slots in enumerate(shard_slots)
        ]
        if early.riders:  # no hook pushed on shard 0 (sample count unknown): the buffers go with its first push now
            buckets[0][len(early.sent[0])].update(early.riders)
            early.riders = {}
        return buckets

    def _wait(
        self, pending: Future[StepResult], started: float, decision: Decision | None,
        sources: dict[str, torch.Tensor] | None, payloads: dict[str, Payload],
    ) -> tuple[StepResult, Redecided | None]:  # fmt: skip
        """The step's result. A push still running `redecide_after(decision)` after `started` is
        redecided once (`_redecide`)."""
        after = redecide_after(decision) if sources is not None else None
        if after is None:
            return pending.result(), None
        try:
            return pending.result(timeout=max(0.0, started + after - time.perf_counter())), None
        except TimeoutError:
            redecided = self._redecide(started, sources or {}, payloads)
        return pending.result(), redecided

    def _redecide(self, started: float, sources: dict[str, torch.Tensor], payloads: dict[str, Payload]) -> Redecided | None:
        """Put a slow push to the policy (on the network thread, while this one waits); on a
        heavier level, re-encode what was withdrawn (updating `payloads`, worker/redecide.py).
        Returns what was done, None when nothing was."""
        elapsed = time.perf_counter() - started
        withdrawal = self._exchange.redecide(lambda link, acked: self.uplink.redecide(link, bytes_acked=acked, elapsed_s=elapsed))
        if withdrawal is None:
            return None
        new, t = withdrawal.decision, time.perf_counter()
        try:
            buckets = [
                {key: self._encoder.encode(key, sources[key], new.spec)[0] if key in sources else p for key, p in b.items()}
                for b in withdrawal.buckets
            ]  # state keys (buffers) are not gradients: they keep their lossless payload
        except BaseException as exc:
            self._exchange.settle(withdrawal, exc)
            raise
        for bucket in buckets:
            payloads.update(bucket)
        self._exchange.settle(withdrawal, buckets)
        encode_s = time.perf_counter() - t
        self.uplink.withdrawn(new, withdrawal.link, bytes_acked=withdrawal.bytes_acked, elapsed_s=elapsed)
        self._encoder.observe_progress(new.level, new.spec)
        log.info("push of step %d withdrawn after %.2f s; %d bucket(s) re-encoded as %s", self.version, elapsed, len(withdrawal.taken), new.spec)
        return Redecided(new.spec, encode_s, time.perf_counter())

    def _probe_path(self) -> None:
        """Before the first decision, the start-up probe the uplink's policy asks for (`Policy.
        probe_bytes`) if connecting did not take it (`Exchange._start`: a probe that failed there,
        or a policy swapped in since). A probe that fails costs only the probe: the first step then
        meets the connection's trouble."""
        nbytes = self.uplink.probe_bytes()
        if nbytes <= 0:
            return
        try:
            sent, seconds = self._exchange.probe(nbytes)
        except NetSenseError as exc:
            log.warning("uplink probe failed (%s); the first steps go out at the unknown-bandwidth level", exc)
            return
        self.uplink.observe_probe(bytes_sent=sent, comm_s=seconds, link=self._exchange.read_link())

    @torch.no_grad()
    def _grad_ready(self, param: torch.Tensor) -> None:
        """Overlap: a parameter's gradient is final for this backward; encode its keys, push full buckets."""
        early = self._backward
        if early is None:
            self._probe_path()
            t = time.perf_counter()
            decision = self._choose(self._exchange.read_link(), t)
            self._early_fields = self._step_fields()
            self._set_fields(self._early_fields)
            early = self._backward = BackwardPushes(
                [len(s) for s in self._replica.shard_slots],
                self.overlap_bucket_bytes,
                decision.spec if decision is not None else self.codec_spec,
                decision,
                self._next_samples,
                self._push_early,
                riders=self._replica.state_payloads(0),  # forward has run: the buffers are this step's
            )
        t = time.perf_counter()
        slots = self._param_slots[id(param)]
        if slots[0].key in early.payloads:  # its gradient already went (or waits) for this step
            raise ConfigError(
                "a second backward before step() with overlap: the hooks pushed the first backward's gradients; "
                "accumulating gradients over several backwards needs overlap=False (--no-overlap)"
            )
        for slot in slots:
            early.add(self.owner[slot.key], slot.key, self._encoder.encode(slot.key, slot.view(param.grad), early.spec)[0])
        early.encode_s += time.perf_counter() - t

    def _push_early(self, shard: int, bucket: dict[str, Payload]) -> Future[int] | Future[BucketReply]:
        assert self._backward is not None and self._backward.samples is not None
        return self._exchange.push_early(shard, bucket, self._backward.samples)

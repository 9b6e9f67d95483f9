"""The wire schema's message types: frozen dataclasses, one per message, and the bounds a receiver
applies (`Limits`).

Types only: how they travel (msgpack, framing) and how incoming bytes are checked against them live
in `wire` (encode, decode) and `validate` (the per-field checks), so a reader of the protocol finds
every field and its meaning here, in one place (docs/PROTOCOL.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from netsense.compression import Payload


@dataclass(frozen=True)
class Limits:
    """Bounds applied to every incoming message before its contents are used."""

    max_message_bytes: int = 512 * 1024 * 1024
    """Largest message accepted; the receiver stops buffering a stream past this."""
    max_keys: int = 4096
    """Most tensors one message may carry."""
    max_elems_per_key: int = 1 << 27
    """Most dense elements one tensor may claim (checked before decoding allocates)."""
    max_parts: int = 8
    """Most byte sections one payload may carry."""
    max_meta: int = 8
    """Most scalars one payload may carry."""
    max_dims: int = 8
    """Most dimensions a tensor shape may have."""
    max_probe_bytes: int = 16 * 1024 * 1024
    """Largest PROBE payload (path measurement bulk data, discarded by the PS)."""


@dataclass(frozen=True)
class Message:
    """Base of every message; `TYPE` is the wire tag."""

    TYPE: ClassVar[str] = ""


@dataclass(frozen=True)
class Hello(Message):
    """Worker -> PS: who I am, and a fresh nonce for the challenge."""

    TYPE: ClassVar[str] = "hello"
    worker_id: str
    """Stable name of the worker (survives restarts, so a rejoin is recognised)."""
    rank: int
    """Rank in the job; rank 0 provides the initial parameters."""
    client_nonce: bytes
    """32 random bytes chosen by the worker, mixed into the MAC."""
    role: str = "worker"
    """``worker`` joins the training barrier; ``probe`` (`netsense probe --ps`) only measures the path
    with PROBE messages and is never counted as a worker."""
    job_id: str = ""
    """The job this worker belongs to (`JOB_ID_RE`; empty: unknown, a peer from before job ids). A PS
    that holds another job's state refuses it (`error(job)`) unless `resume` is set."""
    resume: bool = False
    """Continue the job whose state the PS holds, whatever its id (docs/ARCHITECTURE.md, "Job identity")."""
    site: str = ""
    """The site this peer runs at (`SITE_RE`; empty: not said). A PS told its own site answers the
    pulls of peers at other sites first (docs/ARCHITECTURE.md, "WAN-first release")."""


HELLO_ROLES = ("worker", "probe")
"""Roles a HELLO may claim."""


@dataclass(frozen=True)
class Challenge(Message):
    """PS -> worker: the server's nonce to be signed with the shared secret."""

    TYPE: ClassVar[str] = "challenge"
    server_nonce: bytes
    """32 random bytes, fresh per connection, so a recorded AUTH cannot be replayed."""


@dataclass(frozen=True)
class Auth(Message):
    """Worker -> PS: HMAC-SHA256 over both nonces and the worker id."""

    TYPE: ClassVar[str] = "auth"
    mac: bytes
    """The MAC (32 bytes)."""


@dataclass(frozen=True)
class Welcome(Message):
    """PS -> worker: accepted; the state of the store."""

    TYPE: ClassVar[str] = "welcome"
    version: int
    """Current parameter version (number of applied updates)."""
    initialized: bool
    """False until rank 0 has sent INIT."""
    live_workers: int
    """Workers currently in the sync barrier."""
    staleness: int = -1
    """-1: the PS is synchronous (BSP); s >= 0: asynchronous, a worker may run s versions ahead of
    the slowest (SSP), so pulls return full parameters at whatever version is current."""
    job_id: str = ""
    """The job whose state the PS holds (empty: none yet, or unknown)."""
    site: str = ""
    """The site the PS runs at (`SITE_RE`; empty: not said). A relay at the same site pushes this
    shard only once its pushes to the other sites' shards are acked (docs/ARCHITECTURE.md,
    "WAN pushes first")."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one key lives in the model's `state_dict` (INIT's `model` map; `netsense export`)."""

    name: str
    """The `state_dict` entry the key belongs to."""
    shape: tuple[int, ...]
    """Shape of the whole entry (a chunk key covers part of it)."""
    dtype: str
    """The entry's dtype (`STATE_DTYPES`), which may differ from the wire's (integers travel as float64)."""
    offset: int
    """First flat element of the entry that the key covers."""
    buffer: bool
    """A state key (buffer, frozen parameter): averaged from pushed values, never optimized."""


STATE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
"""Dtypes a `TensorInfo` may name."""
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.\-:]{0,128}$")
"""Job ids: up to 128 characters of ``[A-Za-z0-9_.-:]`` (empty: unknown)."""
SITE_RE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
"""A site name (`netsense launch --sites`, `--site`); use with `fullmatch`."""


@dataclass(frozen=True)
class Init(Message):
    """Rank 0 -> PS: the initial parameters (lossless), one payload per key, in key order."""

    TYPE: ClassVar[str] = "init"
    tensors: dict[str, Payload]
    """Key -> lossless payload."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """Optimizer settings the PS should use (name, lr, ...); validated by the store."""
    world_size: int = 1
    """Workers the first step waits for (until the barrier timeout), so none misses step 0."""
    model: dict[str, TensorInfo] = field(default_factory=dict)
    """Key -> its place in the model's `state_dict`, for every key of `tensors` (empty: a worker from
    before the map; then the PS has no state keys and cannot export)."""


@dataclass(frozen=True)
class Push(Message):
    """Worker -> PS: gradients of step `step` for some keys (one bucket)."""

    TYPE: ClassVar[str] = "push"
    step: int
    """Parameter version the gradients were computed on."""
    samples: int
    """Samples in the worker's batch: weights the average so it equals one big batch."""
    total_keys: int
    """Keys the worker pushes for this step in all buckets (lets the PS know when it is done)."""
    grads: dict[str, Payload]
    """Key -> encoded gradient."""
    hparams: tuple[dict[str, float], ...] = ()
    """The worker's optimizer hyper-parameters for this step, one map per parameter group (names
    and bounds: `netsense.transport.hparams`); the PS applies them to this step. Empty: the PS's
    own settings (a worker from before per-step hyper-parameters)."""
    groups: dict[str, int] = field(default_factory=dict)
    """Key -> index into `hparams` for keys of this push outside group 0 (absent: group 0)."""
    skip: bool = False
    """The worker sits this step out (its AMP grad scaler found Inf/NaN): no gradients, but it
    counts as done for the barrier."""
    keeps: bool = False
    """The worker keeps this step's pushes until its update comes, so a gradient-domain PS may send
    it the other pushes of a key instead of their compressed mean (`Params.sums`;
    docs/ARCHITECTURE.md, "Forwarded pushes"). Left out when False (a relay, an older worker)."""
    intent: str = ""
    """The ladder spec of the level the worker's policy is heading for (its committed level, or the
    one a count of headroom relaxes to; not a probe's), which a gradient-domain PS hands the step's
    other workers (`Params.intents`) so they can meet there (docs/POLICIES.md, "Where the others are
    heading"). Empty: no such policy (left out of the message)."""


@dataclass(frozen=True)
class Pull(Message):
    """Worker -> PS: send parameters once the version reaches `wait_for`."""

    TYPE: ClassVar[str] = "pull"
    have_version: int
    """Version of the worker's replica, or -1 for a full download."""
    wait_for: int
    """Block until the PS version is at least this."""
    keys: tuple[str, ...] = ()
    """Empty: every key. Otherwise a pipelined pull (sync PS, overlap): only these keys, answered
    as soon as the PS has applied them for version `wait_for` (before the whole step is done), as a
    delta from `have_version` = `wait_for` - 1; at most `MAX_PULL_KEYS`."""


MAX_PULL_KEYS = 64
"""Most keys one PULL may name (msgpack's array bound in `decode_message`)."""


MAX_INTENTS = 16
"""Most intents one PARAMS carries: a step of more workers carries none (`Params.intents`)."""

INTENT_RE = re.compile(r"^[A-Za-z0-9_.:+\-]{1,64}$")
"""What an intent may be: a codec spec's characters, at most 64 (`Push.intent`)."""


MAX_SUM_TERMS = 2
"""Most pushes a `Sum` adds: a PS forwards a key's pushes only where at most two workers pushed it
(more cost more bytes than their compressed mean)."""


@dataclass(frozen=True)
class Sum:
    """One key of a gradient-domain update as the pushes that make it up (`Params.sums`): the
    step's gradient is sum(weights[i] * push i), in this order, the recipient's own push at `own`."""

    weights: tuple[float, ...]
    """Each push's weight (its samples over the step's), in the order the PS summed them."""
    own: int
    """Index of the recipient's own push in `weights` (-1: it pushed none of this key)."""
    pushes: tuple[Payload, ...]
    """The other pushes' payloads, in order: one per weight but `own`'s."""
    owners: tuple[str, ...] = ()
    """The PS's own record of whose push each weight is (never on the wire: `for_recipient`)."""

    def for_recipient(self, worker_id: str) -> Sum:
        """What `worker_id` is sent: its own push left out if it is one of them."""
        if worker_id not in self.owners:
            return Sum(self.weights, -1, self.pushes)
        own = self.owners.index(worker_id)
        return Sum(self.weights, own, self.pushes[:own] + self.pushes[own + 1 :])


@dataclass(frozen=True)
class Params(Message):
    """PS -> worker: parameters; `full` is a replacement, otherwise a delta to add."""

    TYPE: ClassVar[str] = "params"
    version: int
    """Version these parameters correspond to."""
    full: bool
    """True: replace the replica; False: add the decoded deltas to it."""
    tensors: dict[str, Payload]
    """Key -> payload."""
    base_version: int = -1
    """For a delta: the version it applies to."""
    pad: bytes = b""
    """Filler the worker drops (a downlink probe padded to a bandwidth sample: docs/POLICIES.md,
    "Probes"); at most `Limits.max_probe_bytes`. Left out of the message when empty."""
    gradient: bool = False
    """A gradient-domain delta (docs/ARCHITECTURE.md, "Gradient-domain downlink"): the tensors are
    the step's compressed aggregated gradient, which the worker's copy of the PS's optimizer
    applies (with the hyper-parameters its own push carried). Left out when False."""
    optimizer: dict[str, Any] = field(default_factory=dict)
    """A full PARAMS of a gradient-domain PS: its optimizer settings (INIT's map), so the worker
    runs the same optimizer. Left out when empty (a parameter-domain PS)."""
    optim_state: dict[str, Payload] = field(default_factory=dict)
    """With `optimizer`: the optimizer's state per key, ``<state name>:<key>`` -> lossless payload
    (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``step``). Left out when empty."""
    sums: dict[str, Sum] = field(default_factory=dict)
    """With `gradient`: keys sent as the pushes that make them up instead of a payload in
    `tensors` (docs/ARCHITECTURE.md, "Forwarded pushes"). Left out when empty."""

    intents: tuple[str, ...] = ()
    """With `gradient`: the intents (`Push.intent`) of the step's other pushers, in the PS's worker
    order; empty where one of them sent none or more than `MAX_INTENTS` pushed. Left out when empty."""
    intent_owners: tuple[str, ...] = ()
    """The PS's own record of whose intent each is (never on the wire: `for_recipient`)."""

    def for_recipient(self, worker_id: str) -> Params:
        """This update as `worker_id` is sent it (`Sum.for_recipient`, and the intents of the
        others); itself without sums or intents."""
        if not self.sums and not self.intent_owners:
            return self
        sums = {k: s.for_recipient(worker_id) for k, s in self.sums.items()}
        intents = tuple(i for i, w in zip(self.intents, self.intent_owners) if w != worker_id)
        return replace(self, sums=sums, intents=intents, intent_owners=())


@dataclass(frozen=True)
class Ack(Message):
    """PS -> worker: request handled."""

    TYPE: ClassVar[str] = "ack"
    version: int
    """PS version when handled."""
    delivered_bytes: int = 0
    """On a PUSH's ACK: the newest update whose every copy was delivered and that this connection
    was not told of yet, one copy's wire bytes; 0 when there is none (left out of the message)."""
    delivered_s: float = 0.0
    """Seconds from that update's first copy written to its last copy acked, on the PS's clock:
    what the update's bytes cost on their way down, every worker's copy included
    (docs/POLICIES.md, "The update's return")."""


@dataclass(frozen=True)
class Error(Message):
    """Either way: the request was refused; nothing was applied."""

    TYPE: ClassVar[str] = "error"
    code: str
    """Machine-readable code (``malformed``, ``auth``, ``shape`` ...)."""
    reason: str
    """What was wrong, with the value."""


@dataclass(frozen=True)
class Probe(Message):
    """Probe -> PS: bulk bytes to measure the path; answered with ACK once received, then dropped."""

    TYPE: ClassVar[str] = "probe"
    data: bytes
    """Filler, at most `Limits.max_probe_bytes`."""


@dataclass(frozen=True)
class Bye(Message):
    """Worker -> PS: leaving on purpose (removed from the barrier at once)."""

    TYPE: ClassVar[str] = "bye"
    reason: str = ""
    """Why, for the log."""


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Challenge, Auth, Welcome, Init, Push, Pull, Params, Ack, Error, Bye, Probe)
}

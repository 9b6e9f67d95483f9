"""`UpdateEncoder`: the downlink bytes of an update, encoded once and sent to every worker.

After each update the encoder encodes ``delta = params - shadow`` once, adds the decoded delta to
`shadow`, and hands the same payloads to every worker, so every replica equals `shadow` bit for
bit (docs/ARCHITECTURE.md, "One synchronous step"). With a lossless downlink codec it sends the
parameters themselves. State keys (buffers, `state`) travel whole and lossless in every whole
update, full or delta (the worker writes them, never adds them). Not to be confused with ps/downlink.py, the policy that picks the codec
(`choose`) per update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from netsense.compression import Codec, Payload, make_codec
from netsense.compression.keycodecs import KeyCodecs
from netsense.compression.progress import codec_clock
from netsense.transport.wire import Params, Sum

from .gradient import LOSSLESS, GradientDownlink

log = logging.getLogger(__name__)

Chooser = Callable[[dict[str, torch.Tensor]], "str | None"]
"""A choice of the next update's codec that needs the update: called with the new parameters
(the update is them less the shadow) just before they are encoded; returns the spec, as `choose`."""

OptimizerView = Callable[[], "tuple[dict[str, Any], dict[str, Payload]]"]
"""The PS optimizer's settings and its state per key (``<name>:<key>`` -> payload): what a full
PARAMS of a gradient-domain downlink carries besides the parameters."""


class UpdateEncoder:
    """The shadow (what every replica holds) and the per-key codecs that encode its updates."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        """The configured downlink codec (`downlink_codec`)."""
        self.shadow: dict[str, torch.Tensor] = {}
        self.last_update: Params | None = None
        """The newest whole-step update, for the pulls of workers one version behind."""
        self.last_encode: tuple[int, str, float] | None = None
        """(version, codec spec, seconds on `codec_clock`) of the last whole-step update encode:
        the downlink policy's measured encode cost of the level it chose (ps/downlink.py), on the
        clock its candidate rounds are timed on."""
        self._chosen: str | None = None  # a downlink policy's choice, overrides `spec`
        self._deferred: Chooser | None = None  # a choice waiting for the update (`defer_choice`)
        self._codecs = KeyCodecs()  # (key, spec) -> encoder (stateful codecs keep per-key state)
        self._fp32 = make_codec("fp32")
        self.state: dict[str, torch.Tensor] = {}
        """The store's state keys (the same dict as `StoreCore.state`)."""
        self.gradient: GradientDownlink | None = None
        """Set (the same object as `StoreCore.gradient`): updates are the step's compressed
        gradient (gradient.py), the shadow is the parameters themselves."""
        self.optimizer_view: OptimizerView | None = None
        """With `gradient`: what a full PARAMS carries of the optimizer (set by the store)."""

    def reset(self, params: dict[str, torch.Tensor]) -> None:
        """Replicas start as the initial parameters; stateful encoders start empty."""
        self.shadow = {k: v.clone() for k, v in params.items()}
        self.restart_codecs()

    def restart_codecs(self) -> None:
        """Stateful encoders start empty."""
        self._codecs.clear()

    @property
    def current_spec(self) -> str:
        """Codec of the next update: the policy's choice, else the configured one."""
        return self._chosen or self.spec

    def choose(self, spec: str | None) -> None:
        """Codec of the next updates (a downlink policy's choice, per update); None: back to the
        configured `spec`. Replicas still equal the shadow bit for bit: the shadow follows
        whatever was sent, and a lossless choice sends the parameters themselves."""
        if spec is not None:
            make_codec(spec)  # a bad spec fails here, not half way through an update
        self._chosen = spec

    def defer_choice(self, chooser: Chooser) -> None:
        """The next update's codec is `chooser`'s answer on the update itself, asked just before it
        is encoded (whole: `deferred` keeps a pipelined step from encoding keys ahead). A chooser
        that raises leaves the codec as it was: the policy's trouble must not cost the step."""
        self._deferred = chooser

    @property
    def deferred(self) -> bool:
        """A choice waits for the next update (`defer_choice`)."""
        return self._deferred is not None

    def _resolve(self, params: dict[str, torch.Tensor]) -> None:
        chooser, self._deferred = self._deferred, None
        if chooser is None:
            return
        try:
            self.choose(chooser(params))
        except Exception:  # noqa: BLE001 - the chooser is a policy's; the update goes out regardless
            log.exception("the deferred downlink choice failed; the update keeps codec %s", self.current_spec)

    # --- encoding -------------------------------------------------------------------------

    def encode_update(self, params: dict[str, torch.Tensor], version: int, base: int) -> None:
        """Encode the whole-step update from `base` to `version` (`last_update`), timed; a deferred
        choice of its codec (`defer_choice`) is made first, untimed."""
        self._resolve(params)
        spec = self.current_spec
        clock = codec_clock()
        t0 = clock()
        if self.gradient is not None:  # compressed before the step (`StoreCore._compress`): timed there
            spec = "gradient"
            self.last_update = self._gradient_update(params, version, base)
        else:
            self.last_update = self._encode_update(params, version, base, spec)
        self.last_encode = (version, spec, clock() - t0)

    def _encode_update(self, params: dict[str, torch.Tensor], version: int, base: int, spec: str) -> Params:
        if spec in LOSSLESS:
            self._follow(params)  # in place: a fresh 32 MB clone cost 8-13 ms per step here
            return self.full_params(version)
        tensors = {}
        for key, param in params.items():
            codec = self._codec(key, spec)
            payload = codec.encode(param - self.shadow[key])
            self.shadow[key] += codec.decode(payload).to(param.dtype)
            tensors[key] = payload
        tensors.update(self.state_payloads())
        return Params(version, False, tensors, base_version=base)

    def _gradient_update(self, params: dict[str, torch.Tensor], version: int, base: int) -> Params:
        """The step's compressed gradients (what every replica's optimizer steps on); the shadow
        follows the parameters, which the replicas now equal."""
        assert self.gradient is not None
        entries = self.gradient.commit(base)
        self._follow(params)
        return gradient_params(version, base, entries, self.state_payloads(), self.gradient.intents)

    def _follow(self, params: dict[str, torch.Tensor]) -> None:
        """The shadow becomes `params`, in place where it can."""
        for key, param in params.items():
            old = self.shadow.get(key)
            if old is not None and old.shape == param.shape and old.dtype == param.dtype:
                old.copy_(param)
            else:
                self.shadow[key] = param.detach().clone()

    def state_payloads(self) -> dict[str, Payload]:
        """Every state key whole and lossless: what each update and full PARAMS carries."""
        return {k: self._fp32.encode(v) for k, v in self.state.items()}  # copies the bytes: a cached update stays put

    def encode_key(self, key: str, param: torch.Tensor, spec: str) -> tuple[Payload | Sum, torch.Tensor]:
        """One key's downlink payload and the shadow value it leaves (as `encode_update`), for a
        key applied ahead of the version: the shadow itself waits for the version. Gradient domain:
        the payload compressed before the key's step (`GradientDownlink.payload`)."""
        if self.gradient is not None:
            return self.gradient.payload(key), param.detach().clone()
        if spec in LOSSLESS:
            value = param.detach().clone()
            return self._fp32.encode(value), value
        codec = self._codec(key, spec)
        payload = codec.encode(param - self.shadow[key])
        return payload, self.shadow[key] + codec.decode(payload).to(param.dtype)

    def _codec(self, key: str, spec: str) -> Codec:
        return self._codecs.get(key, spec)

    # --- what a pull gets -----------------------------------------------------------------

    def lossless(self, version: int, tensors: dict[str, torch.Tensor]) -> Params:
        """`tensors` whole, in fp32."""
        return Params(version, True, {**{k: self._fp32.encode(v) for k, v in tensors.items()}, **self.state_payloads()})

    def full_params(self, version: int) -> Params:
        """The replica every worker must hold (the shadow), lossless; in the gradient domain with
        the optimizer every replica runs, its settings and state."""
        full = self.lossless(version, self.shadow)
        if self.gradient is None or self.optimizer_view is None:
            return full
        settings, state = self.optimizer_view()
        return Params(version, True, full.tensors, optimizer=settings, optim_state=state)

    def pull(self, version: int, have_version: int) -> Params:
        """What a worker at `have_version` needs to reach `version`: the last update if it
        starts there (or is full), else the full shadow."""
        last = self.last_update
        if last is not None and last.version == version and have_version == last.base_version and not last.full:
            return last
        if last is not None and last.version == version and last.full:
            return last
        return self.full_params(version)


def gradient_params(
    version: int, base: int, entries: dict[str, Payload | Sum], state: dict[str, Payload], intents: tuple[tuple[str, str], ...] = ()
) -> Params:
    """A gradient-domain update from `base` to `version`: each key's compressed payload, or its
    forwarded pushes (`Params.sums`), the `state` keys' payloads, and the contributors' (worker,
    intent) pairs (`Params.intents`, each recipient sent the others')."""
    tensors = {k: v for k, v in entries.items() if isinstance(v, Payload)}
    sums = {k: v for k, v in entries.items() if isinstance(v, Sum)}
    owners, specs = (tuple(w for w, _ in intents), tuple(i for _, i in intents)) if intents else ((), ())
    return Params(
        version, False, {**tensors, **state}, base_version=base, gradient=True, sums=sums, intents=specs, intent_owners=owners
    )

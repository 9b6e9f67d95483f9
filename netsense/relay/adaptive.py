"""`AdaptiveUpstream`: the relay's push upstream under the job's uplink policy.

A relay is one worker to each upstream shard, so its WAN push is chosen the way a worker's is:
the same `UplinkController` (link snapshot, compute time, decision log) and the same
`GradientEncoder` (per-key codecs, error feedback, candidate rounds, progress windows), fed the
site's summed gradient instead of a model's. Without it the site's sum went up at one fixed codec
(fp16 under an adaptive policy) whatever the WAN, while only the downlink adapted.

The relay's "compute" between two upstream steps is the site's own step: its workers' compute,
their local pushes and the sum. Encoding and the candidate rounds run off the relay's event loop
(`asyncio.to_thread`): the loop keeps serving the site's connections meanwhile.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from netsense.compression import Payload
from netsense.compression.policy import Decision, Policy
from netsense.compression.policy.link import LinkState
from netsense.compression.sentwindow import SentWindow
from netsense.worker.encoding import GradientEncoder, sent_window_for
from netsense.worker.uplink import UplinkController


class SiteEncoder(GradientEncoder):
    """A `GradientEncoder` over the site's summed gradient (`grads`) rather than a model's slots."""

    def __init__(self, uplink: UplinkController, sent_window: SentWindow | None = None) -> None:
        super().__init__([], uplink, sent_window=sent_window)
        self.grads: dict[str, torch.Tensor] = {}

    def gradients(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.grads.items())


class AdaptiveUpstream:
    """One upstream shard's policy loop; created empty, sized by the first step it encodes."""

    def __init__(self, policy: Policy, *, decision_log: str | Path | None = None, log_fields: dict[str, Any] | None = None) -> None:
        self.policy = policy
        self.decision_log = decision_log
        self.log_fields = log_fields
        self.uplink: UplinkController | None = None
        self.encoder: SiteEncoder | None = None
        self.precondition = False
        """The job's optimizer scales coordinates by their second moment (Adam): set from the site's
        INIT before the first push (`UplinkController`'s `precondition`)."""

    def read_link(self, quic: Any | None, grads: dict[str, torch.Tensor]) -> LinkState:
        """The upstream path now (on the relay's loop, which runs the connection); unknown without
        a connection (the push then reconnects first)."""
        if self.uplink is None:
            payload = sum(4 * g.numel() for g in grads.values())
            self.uplink = UplinkController(
                self.policy, payload_bytes=payload, decision_log=self.decision_log, log_fields=self.log_fields, pads=True,
                precondition=self.precondition,
            )  # pads: `Upstream` sends a decision's filler beside the site's push
            self.encoder = SiteEncoder(self.uplink, sent_window_for(payload // 4, self.uplink))
        if quic is None:
            return LinkState(time.monotonic(), None, None, None)
        return self.uplink.read_link(quic)

    def encode(self, grads: dict[str, torch.Tensor], link: LinkState, started: float) -> tuple[Decision, dict[str, Payload]]:
        """The candidate round when due, the choice, and every key encoded at the chosen level
        under error feedback (off the loop: CPU only)."""
        assert self.uplink is not None and self.encoder is not None, "read_link first"
        self.encoder.grads = grads
        self.encoder.measure_candidates()
        decision = self.uplink.choose(link, started=started)
        self.encoder.take_codec_s()  # what an earlier push that never reached `observe` encoded
        return decision, {key: self.encoder.encode(key, g, decision.spec)[0] for key, g in grads.items()}

    def track_progress(self, decision: Decision) -> None:
        """The sent level's q and the progress window's sample (off the loop, while the push is out)."""
        assert self.encoder is not None
        self.encoder.track_progress(decision.level, decision.spec)

    def observe(
        self,
        payloads: dict[str, Payload],
        *,
        push_s: float,
        encode_s: float,
        wire_s: float,
        step: int,
        pad_bytes: int = 0,
        returned: tuple[int, float] | None = None,
    ) -> None:
        """What the push cost (with `pad_bytes` of filler beside it), and `returned`, an update's
        return as the PS reported it, fed back to the policy; writes its decision-log line."""
        assert self.uplink is not None and self.encoder is not None
        bytes_sent = sum(p.wire_size for p in payloads.values()) + pad_bytes
        codec_s = self.encoder.take_codec_s()
        self.uplink.observe(
            bytes_sent=bytes_sent, pad_bytes=pad_bytes, comm_s=push_s, codec_s=codec_s, encode_s=encode_s, wire_s=wire_s,
            version=step, returned=returned,
        )

    def mark_end(self) -> None:
        """The site's step is over upstream (pushed, skipped or overtaken by a reconnect): the
        site's next compute time counts from now."""
        if self.uplink is not None:
            self.uplink.mark_end()

    @property
    def levels(self) -> dict[str, int]:
        """Steps pushed at each codec spec."""
        return dict(self.uplink.levels) if self.uplink is not None else {}

    def close(self) -> None:
        if self.uplink is not None:
            self.uplink.close()

"""``netsenseml-paper``: the seed paper's prototype law, reproduced as published."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .base import Policy
from .decision import ChooseRequest, Decision, SendReport
from .ladder import Ladder
from .registry import register_policy
from .settings import require, settings_factory


@dataclass(frozen=True)
class PaperPolicySettings:
    """Settings of the seed paper's law; defaults are the published ones where it gives them."""

    window_s: float = 5.0
    """Window over which min RTT and max bandwidth are kept."""
    start: float = 0.75
    """Initial top-k density r."""
    r_min: float = 0.001
    """Lowest density the law may reach."""
    r_max: float = 1.0
    """Highest density the law may reach."""
    shrink: float = 0.95
    """Multiplicative decrease of r when the bytes just sent exceed `threshold` * BDP."""
    grow: float = 0.001
    """Additive increase of r otherwise."""
    threshold: float = 0.9
    """Fraction of the BDP above which a send counts as filling the pipe."""
    codec: str = "topk"
    """Sparsifier the density is handed to: the emitted spec is ``"<codec>:<r>"``."""
    digits: int = 3
    """Significant digits of r in the emitted spec (bounds the number of distinct codecs)."""


class PaperPolicy(Policy):
    """NetSenseML's prototype law (docs/POLICIES.md), reproduced as published: BDP = max bw * min
    RTT over a 5 s window, both measured at the application; after each send, if its bytes
    exceed 0.9 * BDP then r = max(r_min, 0.95 r) else r = min(r_max, r + 0.001); start at 0.75."""

    def __init__(self, ladder: Ladder, settings: PaperPolicySettings) -> None:
        super().__init__(ladder, name="netsenseml-paper")
        s = settings
        require(s.window_s > 0, self.name, "window_s", s.window_s, "> 0")
        require(0 < s.r_min <= s.r_max <= 1, self.name, "r_min/r_max", (s.r_min, s.r_max), "0 < r_min <= r_max <= 1")
        require(s.r_min <= s.start <= s.r_max, self.name, "start", s.start, "within [r_min, r_max]")
        require(0 < s.shrink < 1, self.name, "shrink", s.shrink, "in (0, 1)")
        require(s.grow >= 0, self.name, "grow", s.grow, ">= 0")
        require(s.threshold > 0, self.name, "threshold", s.threshold, "> 0")
        require(1 <= s.digits <= 8, self.name, "digits", s.digits, "in [1, 8]")
        self.settings = s
        self.density = s.start
        """Current top-k density r (unrounded)."""
        self._bw: deque[tuple[float, float]] = deque()  # (time, bytes/s) at the application
        self._rtt: deque[tuple[float, float]] = deque()  # (time, seconds)
        self._now = 0.0
        self.level_of(self.spec, 1 << 20)  # fail at config time if the sparsifier is not registered

    @property
    def spec(self) -> str:
        """The codec spec for the current density."""
        return f"{self.settings.codec}:{self.density:.{self.settings.digits}g}"

    @property
    def bdp_bytes(self) -> float | None:
        """max bandwidth * min RTT over the window, None until both have a sample."""
        if not self._bw or not self._rtt:
            return None
        return max(b for _, b in self._bw) * min(r for _, r in self._rtt)

    def choose(self, request: ChooseRequest) -> Decision:
        link = request.link
        self._now = link.time_s
        rtt = link.srtt_s if link.srtt_s is not None else link.min_rtt_s
        if rtt is not None:
            self._add(self._rtt, link.time_s, rtt)
        index, level = self.level_of(self.spec, request.payload_bytes)
        bw = max((b for _, b in self._bw), default=None)
        return self._decision(
            request,
            level_index=index,
            level=level,
            reason=f"paper: r={self.density:.6g} bdp={self.bdp_bytes}",
            bandwidth_Bps=bw,
        )

    def observe(self, report: SendReport) -> None:
        """Adds the send's rate (bytes / comm time) and any RTT sample, then applies the law."""
        t = self._now if report.time_s is None else report.time_s
        self._now = t
        if report.bytes_sent > 0 and report.comm_s > 0:
            self._add(self._bw, t, report.bytes_sent / report.comm_s)
        if report.rtt_s is not None and report.rtt_s > 0:
            self._add(self._rtt, t, report.rtt_s)
        bdp = self.bdp_bytes
        if bdp is None:
            return
        s = self.settings
        if report.bytes_sent > s.threshold * bdp:
            self.density = max(s.r_min, s.shrink * self.density)
        else:
            self.density = min(s.r_max, self.density + s.grow)

    def _add(self, window: deque[tuple[float, float]], t: float, value: float) -> None:
        window.append((t, value))
        cutoff = t - self.settings.window_s
        for w in (self._bw, self._rtt):
            while w and w[0][0] < cutoff:
                w.popleft()


register_policy("netsenseml-paper", settings_factory("netsenseml-paper", PaperPolicy, PaperPolicySettings))

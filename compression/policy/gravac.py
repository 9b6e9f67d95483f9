"""``gravac``: the heaviest compression factor whose compression gain stays above epsilon.

Theirs (Tyagi and Swany, "GraVAC: Adaptive Compression for Communication-Efficient Distributed DL
Training", IEEE CLOUD 2023, arXiv 2305.12201; the authors' code, github.com/sahiltyagi4/GraVAC,
`gravac_py3/run/compression_throughput.py`, launched by `gravac_py3/scripts/run_gravac.sh`, with
`helper/misc.py` for the gain and the smoothing): top-k with error feedback, a compression factor
(CF, the fraction kept) between theta_min (0.1) and theta_max. The first `windowsize` (25) steps
send theta_min. Every step compresses the gradient at theta_min and at the current CF, each through
its own compressor and residuals, and takes each one's compression gain = ||C(g + e)|| / ||g||
(norms smoothed over the last 25 steps, an EWMA with alpha 0.05). The step sends the current CF if
its gain >= epsilon (0.75), else theta_min if its gain >= epsilon, else the dense gradient. The
compression throughput of the CF sent is its gain times the step's throughput (samples/s). At each
epoch's end the CF is multiplied by `cfstepsize` (0.5), not past theta_max; when the two best
compression throughputs seen are within omega (0.05) of each other, the search stops at the more
compressed of those two CFs.

Ours: the gain is sqrt(q) ||g + r|| / ||g||, q the progress efficiency the worker measures on g + r
(`Policy.observe_progress`: the candidate rounds this policy asks for with `progress_candidates`,
and the error-feedback sums of the level just sent), so 1 - ||v - C(v)||^2 / ||v||^2 with v = g + r;
for a projection (top-k, PowerSGD) that is ||C(v)||^2 / ||v||^2, and the round's ||v|| / ||g||
(`observe_round_norms`) makes it their norm ratio. The residual is the level sent's rather than one
per candidate. (Until 2026-12-02 the gain was sqrt(q) alone: with ||g + r|| for ||g||, the residual
of error feedback held every deeper factor under epsilon, and runs never left theta_min.) One gain
per level, smoothed over its own last `window` figures (theirs smooths the numerator and the
denominator separately, and the current CF's tracker carries over from the previous CF). Steps, not
epochs: the factor moves every `interval` steps after the warm-up (theirs: once an epoch). The
factors are codec specs: by default `topk:<theta>+fp16` from theta_min down by `step` to theta_max
(theirs: fp32 values; ours: the ladder's top-k wire format), or any list in `levels`; they and
`dense` make this policy's own ladder (the configured one lends only its calibration). Throughput:
1 / (compute_s + comm_s) of each send (`Policy.observe`), smoothed like the gain (theirs: the step's
last value). Their published code's move compares kept fractions the wrong way round (theta_min
jumps to theta_max) and would otherwise always set min_cf * cfstepsize, and after the warm-up it
sends nothing while the CF is theta_min; we multiply the current factor by `step` and apply the same
gain rule at theta_min. The paper's other scaling policy and its multi-level compression are not in
their code (its README: multi-level "still needs implementation") and are not here; the rule above
was read in the code, the paper only in its summary. The uplink feeds the gains and the send times;
the PS's downlink feeds candidate rounds on its parameter updates and its send times too. A
direction that feeds no gain holds theta_min (the warm-up level). The link is not consulted beyond
the send times.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .base import Policy
from .decision import ChooseRequest, Decision, SendReport
from .ladder import Ladder
from .registry import register_policy
from .settings import require, settings_factory


@dataclass(frozen=True)
class GravacSettings:
    """Settings of the gravac peer; epsilon, omega, window, alpha, theta_min and step are theirs."""

    theta_min: float = 0.1
    """Least compression: the top-k fraction kept in the warm-up and the fallback (their min_cf)."""
    theta_max: float = 0.001
    """Most compression: the smallest fraction kept (their code's default 0.0001; ours stops at the
    default ladder's heaviest top-k, 0.1%)."""
    step: float = 0.5
    """Factor on the kept fraction at each move (their cfstepsize)."""
    levels: str = ""
    """Comma-separated codec specs, least compressed first, replacing the top-k family built from
    theta_min, theta_max and step (e.g. ``"powersgd:4,powersgd:2,powersgd:1"``); "" uses the family."""
    dense: str = "fp32"
    """What is sent when even the least compressed level's gain is below epsilon (theirs: dense)."""
    epsilon: float = 0.75
    """Least compression gain a level must keep to be sent."""
    omega: float = 0.05
    """Relative gap between the two best compression throughputs under which the search stops."""
    window: int = 25
    """Steps of warm-up at the first level, and figures each smoothed value holds (their windowsize)."""
    alpha: float = 0.05
    """EWMA weight of the newest figure inside the window (their alpha)."""
    interval: int = 25
    """Steps per factor before the next (their one epoch, ~195 steps; our runs are a few hundred
    steps, so one window per factor: the default eight factors take ~200)."""


class Smoothed:
    """The last `window` figures, read as an EWMA with weight `alpha` on the newest (pandas'
    adjusted form, which their `MovingWindowAverage` uses); None before the first figure."""

    def __init__(self, window: int, alpha: float) -> None:
        self.alpha = alpha
        self._values: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> None:
        self._values.append(value)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def value(self) -> float | None:
        """The weighted mean: weight (1 - alpha)^age, normalised."""
        if not self._values:
            return None
        keep, total, weights = 1.0 - self.alpha, 0.0, 0.0
        for age, v in enumerate(reversed(self._values)):
            w = keep**age
            total, weights = total + w * v, weights + w
        return total / weights


def family(theta_min: float, theta_max: float, step: float) -> list[str]:
    """Top-k specs from `theta_min` down by `step` to `theta_max` (three significant digits, as
    `netsenseml-paper` writes its own), least compressed first; the last is `theta_max`."""
    thetas, theta = [], theta_min
    while theta > theta_max * (1 + 1e-9):
        thetas.append(theta)
        theta *= step
    thetas.append(theta_max)
    specs = [f"topk:{t:.3g}+fp16" for t in thetas]
    return list(dict.fromkeys(specs))  # rounding can merge two factors


class GravacPolicy(Policy):
    """GraVAC's rule: the current factor while its gain >= epsilon, else the first, else dense."""

    def __init__(self, ladder: Ladder, settings: GravacSettings) -> None:
        super().__init__(ladder, name="gravac")
        s = settings
        num = (int, float)
        require(isinstance(s.theta_min, num) and 0 < s.theta_min <= 1, self.name, "theta_min", s.theta_min, "in (0, 1]")
        require(
            isinstance(s.theta_max, num) and 0 < s.theta_max <= s.theta_min,
            self.name, "theta_max", s.theta_max, "in (0, theta_min]",
        )  # fmt: skip
        require(isinstance(s.step, num) and 0 < s.step < 1, self.name, "step", s.step, "in (0, 1)")
        require(isinstance(s.epsilon, num) and 0 < s.epsilon <= 1, self.name, "epsilon", s.epsilon, "in (0, 1]")
        require(isinstance(s.omega, num) and s.omega > 0, self.name, "omega", s.omega, "> 0")
        require(isinstance(s.window, int) and s.window >= 1, self.name, "window", s.window, "an int >= 1")
        require(isinstance(s.alpha, num) and 0 < s.alpha <= 1, self.name, "alpha", s.alpha, "in (0, 1]")
        require(isinstance(s.interval, int) and s.interval >= 1, self.name, "interval", s.interval, "an int >= 1")
        require(isinstance(s.levels, str), self.name, "levels", s.levels, "comma-separated codec specs")
        require(isinstance(s.dense, str) and bool(s.dense), self.name, "dense", s.dense, "a codec spec")
        self.settings = s
        given = [x.strip() for x in s.levels.split(",")] if s.levels.strip() else None
        specs = given or family(s.theta_min, s.theta_max, s.step)
        # Its own ladder (index 0 dense, then the factors), so that the candidate rounds, which
        # measure `self.ladder` levels, can price every factor; calibrated figures carry over.
        # An unknown or repeated spec is a ConfigError here, at config time.
        self.ladder = Ladder.parse([s.dense, *specs]).with_measurements(ladder)
        self.current = 1
        """Ladder index of the factor under evaluation (1: the least compressed)."""
        self.searching = True
        """Whether the factor still moves (False once the omega test settled it)."""
        self.gains = [Smoothed(s.window, s.alpha) for _ in self.ladder]
        """Per level: its compression gains sqrt(q)."""
        self.throughputs = [Smoothed(s.window, s.alpha) for _ in self.ladder]
        """Per level: gain / step time of its sends (their compression throughput, per second)."""
        self.sent: int | None = None
        """Ladder index of the last decision."""
        self._steps = 0  # decisions so far (a step each, in both directions)
        self._next_move = s.window  # decision count at which the factor next moves
        self._compute_s = 0.0  # the last request's compute time, for the sends' step times
        self.inflation = 1.0
        """||g + r|| / ||g|| of the latest candidate round (`observe_round_norms`; the uplink's:
        the downlink's rounds measure the update itself, for which the ratio is 1)."""

    def gain(self, level: int) -> float | None:
        """The smoothed compression gain of ladder level `level` (1 for the dense level), None unmeasured."""
        return 1.0 if level == 0 else self.gains[level].value

    @property
    def warming_up(self) -> bool:
        """The first `window` steps, or until the first factor has a gain: send that factor."""
        return self._steps < self.settings.window or self.gain(1) is None

    wants_round_norms = True

    def observe_round_norms(self, *, step: int, gradient_norm: float, input_norm: float) -> None:
        """||g|| and ||g + r|| of the round whose q come next: their ratio turns sqrt(q) =
        ||C(g + r)|| / ||g + r|| into their gain, ||C(g + r)|| / ||g||. Figures that are not finite,
        or a zero gradient, leave the last ratio."""
        ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (gradient_norm, input_norm))
        if ok and gradient_norm > 0 and input_norm >= 0:
            self.inflation = input_norm / gradient_norm

    def observe_progress(self, *, level: int, progress: float, interim: bool = False) -> None:
        """q of `level` on g + r; its square root times ||g + r|| / ||g|| (`inflation`) is the
        level's compression gain, as theirs (an `interim` figure counts as any other: their
        gains are a window of samples already)."""
        if not (isinstance(progress, (int, float)) and math.isfinite(progress) and progress >= 0):
            return  # no evidence of a gain (the encoder zeroes non-finite keys)
        if isinstance(level, int) and 0 < level < len(self.ladder):
            self.gains[level].add(math.sqrt(min(1.0, float(progress))) * self.inflation)

    def progress_candidates(self, step: int) -> list[int]:
        """The first factor every step (their min-CF compressor), and the factor under evaluation."""
        return [1] if self.current == 1 else [1, self.current]

    def observe(self, report: SendReport) -> None:
        """One send's compression throughput: its level's gain over the step's time."""
        level, step_s = report.level, self._compute_s + report.comm_s
        if not (isinstance(level, int) and 0 <= level < len(self.ladder)):
            return
        gain = self.gain(level)
        if gain is not None and math.isfinite(step_s) and step_s > 0 and report.comm_s >= 0:
            self.throughputs[level].add(gain / step_s)

    def _settle(self) -> None:
        """At a move: stop at the more compressed of the two best compression throughputs when they
        are within omega (re-checked at every move, as theirs is each epoch); else the next factor."""
        seen = sorted(
            ((v, level) for level, t in enumerate(self.throughputs) if (v := t.value) is not None), reverse=True
        )
        if len(seen) >= 2 and seen[1][0] > 0 and abs(seen[0][0] - seen[1][0]) / seen[1][0] < self.settings.omega:
            self.searching = False
            self.current = max(1, seen[0][1], seen[1][1])  # higher index: more compressed
        elif self.searching:
            self.current = min(self.current + 1, len(self.ladder) - 1)

    def choose(self, request: ChooseRequest) -> Decision:
        self._compute_s = request.compute_s if math.isfinite(request.compute_s) and request.compute_s >= 0 else 0.0
        warm = self.warming_up
        if not warm and self._steps >= self._next_move:
            self._settle()
            self._next_move = self._steps + self.settings.interval
        self._steps += 1
        eps, cur = self.settings.epsilon, self.current
        g_cur, g_min = self.gain(cur), self.gain(1)
        # A factor just moved to has no gain yet: theta_min (or dense) until its first figure.
        if warm:
            index, why = 1, "warm-up"
        elif cur != 1 and g_cur is not None and g_cur >= eps:
            index, why = cur, "current"
        elif g_min is not None and g_min >= eps:
            index, why = 1, "first"
        else:
            index, why = 0, "dense"
        self.sent = index
        shown = ", ".join("n/a" if g is None else f"{g:.3g}" for g in (g_cur, g_min))
        return self._decision(
            request,
            level_index=index,
            level=self.ladder[index],
            reason=f"gravac: {why} factor={self.ladder[cur].spec} gains={shown} eps={eps:g}"
            f"{'' if self.searching else ' settled'}",
            bandwidth_Bps=request.link.bandwidth_Bps,
        )


register_policy("gravac", settings_factory("gravac", GravacPolicy, GravacSettings))

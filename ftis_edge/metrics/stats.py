"""The package's statistics, pure functions of counts and values (no I/O, no package import):
the intervals the eval command and the held-out eval print, the paired change the guard judges,
the exact McNemar tests, and the mean ± SE and one-sided t-test over seeds the experiment
reports give.

One z for every 95% interval (``Z95``), so an accuracy's interval and a change's interval are
the same kind of 95%.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

Z95 = statistics.NormalDist().inv_cdf(0.975)      # 1.959964: two-sided 95% of a normal


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials ((0, 1) when n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # none (all) right: the end is 0 (1) exactly, not what rounding leaves of center - half
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return lo, hi


@dataclass(frozen=True)
class PairedChange:
    """``now`` − ``ref`` accuracy on the same prompts. ``lost``: right before, wrong now;
    ``gained``: the reverse. SE of a paired difference of proportions:
    sqrt((lost + gained − (gained − lost)² / n)) / n — only prompts that changed add variance."""
    diff: float
    se: float
    lost: int
    gained: int
    n: int

    @property
    def interval(self) -> tuple[float, float]:
        return self.diff - Z95 * self.se, self.diff + Z95 * self.se

    @property
    def p_worse(self) -> float:
        """One-sided exact McNemar: the chance of ``lost`` or more of the changed prompts going
        the wrong way if nothing changed (each changed prompt a fair coin)."""
        return mcnemar_worse(self.lost, self.gained)


def paired_change(now: Sequence[bool], ref: Sequence[bool]) -> PairedChange:
    if len(now) != len(ref):
        raise ValueError(f"paired change needs the same prompts: {len(now)} vs {len(ref)} answers")
    n = len(now)
    lost = sum(1 for a, b in zip(now, ref) if b and not a)
    gained = sum(1 for a, b in zip(now, ref) if a and not b)
    if n == 0:
        return PairedChange(0.0, 0.0, 0, 0, 0)
    var = max(0.0, lost + gained - (gained - lost) ** 2 / n)
    return PairedChange((gained - lost) / n, math.sqrt(var) / n, lost, gained, n)


def mcnemar_worse(lost: int, gained: int) -> float:
    """P(X >= lost), X ~ Binomial(lost + gained, 1/2): exact, one-sided."""
    m = lost + gained
    if m == 0:
        return 1.0
    return sum(math.comb(m, k) for k in range(lost, m + 1)) / 2 ** m


def mcnemar_two_sided(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p for prompts only A got right against only B (the reports'
    either-way question; the guard asks the one-sided one)."""
    return min(1.0, 2 * mcnemar_worse(max(a_only, b_only), min(a_only, b_only)))


def mean_se(values: Iterable[float | None]) -> tuple[float, float]:
    """Mean and standard error of the values that exist (None and NaN are left out); NaN for
    what one value cannot give (the SE of one, both of none)."""
    xs = [x for x in values if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return statistics.fmean(xs), se


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with a whole number of degrees of freedom: the closed series of
    Abramowitz & Stegun 26.7.3–4 (exact; the standard library has no t distribution)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:          # odd: A = (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, series = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= (2 * k) / (2 * k + 1) * c * c
            series += term
        inside = 2 / math.pi * (theta + s * c * series)
    else:               # even: A = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term, series = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c * c
            series += term
        inside = s * series
    tail = max(0.0, (1 - inside) / 2)       # P(T > |t|)
    return tail if t >= 0 else 1 - tail


def t_test_greater(values: Iterable[float | None]) -> tuple[float, float]:
    """One-sample one-sided t-test of mean > 0 over the values that exist: (t, p). NaN for fewer
    than two values; a zero spread gives t = ±inf (p 0 or 1) unless the mean is 0 too (p = 0.5)."""
    xs = [x for x in values if x is not None and not math.isnan(x)]
    if len(xs) < 2:
        return float("nan"), float("nan")
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    if sd == 0:
        return (0.0, 0.5) if m == 0 else (math.copysign(math.inf, m), 0.0 if m > 0 else 1.0)
    t = m / (sd / math.sqrt(len(xs)))
    return t, t_sf(t, len(xs) - 1)

"""One GPU at one evaluation: its condition from its margin, forecast and signatures.

Thermal margin = slowdown temperature - temperature.

* CRITICAL: margin at or under ``critical_margin_c``, or within ``shutdown_margin_c``
  of the shutdown temperature.
* WARNING: margin at or under ``enter_margin_c``; or a trusted trend (one that has
  been beating persistence) makes the *earliest* plausible breach (the confidence
  bound) come within the drain horizon (``lead_time_s x lead_margin``).
* UNKNOWN: temperature or slowdown threshold missing, stale or BAD.
* OK otherwise.
"""

from __future__ import annotations

import msgspec

from policies.forecast import TimeToThreshold
from policies.freshness import fresh
from policies.gpu_tracker import GpuTracker
from policies.model import Assessment, Condition, FaultDomain
from policies.settings import PolicySettings
from policies.wording import gpu_detail


class GpuView(msgspec.Struct, eq=False):
    """One GPU as the rules see it at one evaluation; its Assessment is built when read.

    An evaluation makes one per GPU and the rules read only its numbers; a replay,
    which prints decisions alone, reads nothing else. The words of an assessment's
    detail are formatted (from the values and settings of that evaluation) for the
    assessments someone reads: evidence, the API, the node's detail. A Struct, as
    Assessment is: a replay builds one per GPU per evaluation, and msgspec builds a
    Struct of these sixteen fields several times faster than a dataclass.
    """

    subject: str
    at: float
    condition: Condition
    settings: PolicySettings
    value: float | None = None  # the temperature (None: unknown, and ``why`` says why)
    threshold: float | None = None  # the slowdown temperature
    margin: float | None = None
    ttt: TimeToThreshold | None = None
    trend_per_min: float | None = None  # set with a trusted trend only
    fall_c_per_s: float | None = None  # trusted margin decline rate
    predicted: bool = False  # WARNING from the forecast alone
    at_risk: bool = False  # a forecast breach within twice the drain horizon
    # Heating faster than max_gpu_rate_c_per_min over two confirm windows at flat power
    # (the signature of heat removal failing, not of load): the newer window's rate, C/s.
    fast_heating_c_per_s: float | None = None
    # Margin this GPU would have at its enforced power limit, from the lower bound of its
    # thermal resistance estimate and what it rejects heat to now (None: no estimate).
    full_load_margin: float | None = None
    shutdown: float | None = None  # the shutdown temperature, where it made this CRITICAL
    why: str = ""  # why the GPU is unknown
    _assessment: Assessment | None = None  # built when first read

    @property
    def detail(self) -> str:
        """The assessment's words (see :func:`policies.wording.gpu_detail`)."""
        return gpu_detail(self)

    @property
    def assessment(self) -> Assessment:
        """The GPU's assessment at that evaluation (built once, when first read)."""
        a = self._assessment
        if a is None:
            ttt = self.ttt
            a = self._assessment = Assessment(
                self.subject,
                FaultDomain.GPU,
                self.condition,
                self.at,
                value=self.value,
                unit="celsius" if self.value is not None else "",
                threshold=self.threshold,
                trend_per_min=self.trend_per_min,
                time_to_threshold_s=ttt.point_s if ttt is not None else None,
                detail=self.detail,
            )
        return a


def assess_gpu(
    gpu: str, t: GpuTracker, now: float, reference: float | None, s: PolicySettings
) -> GpuView:
    """GPU ``gpu`` (its index label) at ``now``; ``reference``: what it rejects heat to."""
    subject = "gpu" + gpu
    stale = s.stale_after_s
    critical = s.critical_margin_c
    temp = t.fresh_temperature(now, stale)
    slow = t.fresh_slowdown(now, stale)
    if temp is None or slow is None:
        why_t = fresh(t.temperature, now, stale)[1]
        why_s = fresh(t.slowdown, now, stale)[1]
        detail = f"temperature {why_t}" if temp is None else f"slowdown threshold {why_s}"
        return GpuView(subject, now, Condition.UNKNOWN, s, why=detail)
    fast = fast_heating(t, now, s.max_gpu_rate_c_per_s)
    margin = slow - temp
    forecaster = t.margin
    # A steady GPU's forecaster is untrusted: no trend, no time to threshold.
    ttt: TimeToThreshold | None = None
    per_min: float | None = None
    fall: float | None = None
    predicted = at_risk = False
    trend = forecaster.trend
    if trend is not None and forecaster.trusted:
        ttt = forecaster.time_to(critical, falling=True, at=now)
        per_min = -trend.slope * 60
        fall = -trend.slope if trend.falling else None
        early = ttt.early_s if ttt is not None else None
        if early is not None:
            horizon = s.drain_horizon_s
            predicted = early <= horizon
            at_risk = early <= 2 * horizon
    full = full_load_margin(t, slow, reference, now, s.trend_min_points, stale)
    shutdown: float | None = None
    enter = s.enter_margin_c
    if margin <= critical:
        cond = Condition.CRITICAL
    elif (shut := t.fresh_shutdown(now, stale)) is not None and (
        shut - temp <= s.shutdown_margin_c
    ):
        cond = Condition.CRITICAL
        shutdown = shut
    elif margin <= enter or predicted:
        cond = Condition.WARNING
    else:
        cond = Condition.OK
    return GpuView(
        subject,
        now,
        cond,
        s,
        value=temp,
        threshold=slow,
        margin=margin,
        ttt=ttt,
        trend_per_min=per_min,
        fall_c_per_s=fall,
        predicted=cond is Condition.WARNING and margin > enter,
        at_risk=at_risk,
        fast_heating_c_per_s=fast,
        full_load_margin=full,
        shutdown=shutdown,
    )


def fast_heating(t: GpuTracker, now: float, fastest: float) -> float | None:
    """The heating rate (C/s) when both confirm windows exceed ``fastest``, at flat power.

    ``fastest``: the step rate, ``max_gpu_rate_c_per_min / 60``.
    """
    # The rate first: it is rarely that fast, and its window slope is usually known
    # already (worked out when the newest temperature was taken).
    rate = t.fast_heating(now, fastest)
    return rate if rate is not None and t.power_steady() else None


def full_load_margin(
    t: GpuTracker,
    slowdown: float,
    reference: float | None,
    now: float,
    min_points: int,
    stale_after_s: float,
) -> float | None:
    """Slowdown minus the temperature at the enforced power limit (conservative bound).

    It drains a node in service and holds a drained one out while the estimate stays
    unfit; after a repair the estimate follows within its window of steady periods.
    """
    if reference is None:
        return None
    est = t.resistance.estimate(min_points)
    if est is None:
        return None
    limit = t.fresh_limit(now, stale_after_s)
    if limit is None:
        return None
    return slowdown - (reference + est.lo * limit)


def gpu_order(gpu: str) -> tuple[int, str]:
    """Sort key: GPUs by index, numbers first."""
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def least_margin(gpus: list[GpuView]) -> GpuView | None:
    """The GPU with the smallest margin (ties: the lower index, as listed)."""
    best: GpuView | None = None
    for g in gpus:
        if g.margin is not None and (best is None or best.margin is None or g.margin < best.margin):
            best = g
    return best

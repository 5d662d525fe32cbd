"""The policy's words: what a decision's reason and an assessment's detail say.

Formatted only when someone reads them (a decision made, an assessment shown): a
replay, which prints decisions alone, evaluates every GPU every second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.model import REASON_PREFIX, Condition, FaultDomain
from policies.rules import Verdict
from policies.settings import PolicySettings

if TYPE_CHECKING:
    from policies.gpu import GpuView

DOMAIN_WORDS = {
    FaultDomain.GPU: "GPU",
    FaultDomain.NODE: "node",
    FaultDomain.RACK: "rack",
    FaultDomain.COOLING_LOOP: "cooling loop",
}


def minutes(seconds: float) -> str:
    """Seconds as people read them: ``90s`` and under, else whole minutes."""
    # printf, as the GPU words.
    return "%.0f min" % (seconds / 60) if seconds >= 90 else "%.0fs" % seconds  # noqa: UP031


def temp_words(g: GpuView) -> str:
    """``gpu3 87C``."""
    assert g.value is not None
    return f"{g.subject} {g.value:.0f}C"


def reason(g: GpuView, hot_gpus: int, domain: FaultDomain, why: str, s: PolicySettings) -> str:
    """The reason of a drain or exclusion for hot GPU ``g`` (one of ``hot_gpus``)."""
    assert g.value is not None and g.threshold is not None and g.margin is not None
    others = hot_gpus - 1
    more = f" (+{others} more GPU{'s' if others > 1 else ''})" if others else ""
    if g.condition is Condition.CRITICAL:
        if g.margin <= s.critical_margin_c:
            what = f"at or above slowdown {g.threshold:.0f}C"
        else:
            what = f"near shutdown ({g.detail.rsplit(', ', 1)[-1]})"
        text = f"{REASON_PREFIX} {temp_words(g)} {what}{more}"
    elif g.predicted and g.ttt is not None and g.ttt.point_s is not None:
        rate = f"{g.trend_per_min:+.1f}C/min" if g.trend_per_min is not None else "rising"
        text = (
            f"{REASON_PREFIX} {temp_words(g)}, {rate}: near slowdown {g.threshold:.0f}C "
            f"in ~{minutes(g.ttt.point_s)}{more}"
        )
    else:
        text = f"{REASON_PREFIX} {temp_words(g)} near slowdown {g.threshold:.0f}C{more}"
    if domain in (FaultDomain.COOLING_LOOP, FaultDomain.RACK) and why:
        text += f"; {DOMAIN_WORDS[domain]}: {why}"
    return text


def gpu_detail(g: GpuView) -> str:
    """A known GPU's words: the numbers, then the trend, the signatures, the forecast."""
    temp, slow, margin = g.value, g.threshold, g.margin
    if temp is None or slow is None or margin is None:
        return g.why
    s = g.settings
    # printf-style: the same text as an f-string, at about two thirds of the cost.
    words = ["%.0fC, %.1fC below slowdown %.0fC" % (temp, margin, slow)]  # noqa: UP031
    if g.trend_per_min is not None:
        words.append("%+.1fC/min" % g.trend_per_min)  # noqa: UP031
    fast = g.fast_heating_c_per_s
    if fast is not None:
        words.append("heating %+.0fC/min at flat power" % (fast * 60))
    full = g.full_load_margin
    if full is not None and full < s.exit_margin_c:
        words.append("%.1fC below slowdown at full power" % full)  # noqa: UP031
    ttt = g.ttt
    if ttt is not None and ttt.point_s is not None and ttt.point_s > 0:
        late_w = minutes(ttt.late_s) if ttt.late_s is not None else "never"
        early_w = minutes(ttt.early_s) if ttt.early_s is not None else "?"
        band = f"{early_w} to {late_w} at {s.confidence:.0%}"
        words.append(f"slowdown in ~{minutes(ttt.point_s)} ({band})")
    shut = g.shutdown
    if shut is not None:
        words.append("%.1fC below shutdown %.0fC" % (shut - temp, shut))  # noqa: UP031
    return ", ".join(words)


def node_detail(v: Verdict, hot: GpuView | None, gpus: tuple[GpuView, ...], note: str) -> str:
    """A node assessment's words: its hot GPU's, or why it is unknown; and any note."""
    if v.condition is Condition.UNKNOWN:
        unknown = [f"{g.subject}: {g.detail}" for g in gpus if g.margin is None]
        text = "; ".join(unknown) or "no GPU readings"
    elif v.following:
        text = v.reason.removeprefix(REASON_PREFIX).strip()
    elif hot is not None:
        text = f"{hot.subject}: {hot.detail}"
    else:
        text = ""
    if note:
        text = f"{text} [{note}]" if text else note
    return text

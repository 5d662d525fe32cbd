"""The scenario table: the policy replayed over every simulator scenario, scored against truth.

Per scenario (the simulator stepped directly, 1 s GPU readings, 5 s PDU/CDU
readings, the same policy evaluating every node once a second):

* warning window: the fault's onset (its first event other than a job start,
  stop or power cap) to the first GPU reading at or above its slowdown temperature;
* drain: the first drain or exclusion of the last expected node to be acted on;
* lead: crossing minus that drain (the worst node's), and as a multiple of the
  configured lead time (target 1x-2x for slow events; before the crossing for fast ones);
* false drains: nodes acted on that the scenario's ``[expect]`` does not list;
* throttled GPU-seconds in service: GPU-seconds at or above slowdown before the
  node's drain (fakes/sim/scoring.py): the outcome rackguard exists to keep at 0;
* forecast MAE at 60 s and 300 s of the policy's own forecasters against
  persistence (the last bucket mean), over the slow signals: GPU thermal margin,
  inlet air, coolant supply temperature and flow. A forecast is made at each
  bucket close and compared with the bucket mean ``h`` seconds later.

Then the real nvidia-smi traces of ../shared/data/gpu replayed through the same
policy (drains counted; none expected), with persistence against naive trend
extrapolation on them.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from bench.cap_scoring import ladder_rows, real_trace_caps
from bench.report import Row
from fakes.sim import list_scenarios, load_scenario
from fakes.sim.scoring import DecisionScore, first_crossing, onset, throttled_in_service
from fakes.sim.trace_writer import scenario_readings
from policies.kernel.buckets import BucketWindow
from policies.model import Action, Quality, Reading, SensorKind
from policies.replay import replay_readings
from policies.settings import PolicySettings
from policies.trace import Header
from policies.tracking import Tracker

HORIZONS = (60.0, 300.0)
SLOW_EVENTS = ("chiller-loss",)  # GPU crossing drained 1x-2x lead_time_s ahead
FACILITY_EVENTS = ("crac-loss", "crac-slow")  # facility limit crossing drained 1x-2x ahead
# Loop failures: every node acted on <= FAST_ACT_S after the onset (where the CDU
# reports) and >= FAST_LEAD_S before the first GPU reaches slowdown.
FAST_EVENTS = ("pump-failure", "pump-failure-idle-node", "recovery")
BLIND_EVENTS = ("pump-failure-cdu-silent",)  # lead >= FAST_LEAD_S only
FAST_ACT_S = 10.0
FAST_LEAD_S = 20.0
ROOT = Path(__file__).resolve().parent.parent
GPU_DATA = ROOT.parent / "shared" / "data" / "gpu"

# Thresholds of the parts in the real traces (nvidia-smi -q): the A100 from the
# A100-SXM4 sample in ../shared/data/gpu (slowdown 89, shutdown 92); the V100
# SXM2's as nvidia-smi reports them (slowdown 87, shutdown 90). Power limits are
# the boards' defaults (A100 PCIe 40GB 250 W, V100 SXM2 300 W).
REAL_TRACES = {
    "A100-PCIe-40GB_pwr_update_freq_gpudata.csv": (89.0, 92.0, 250.0),
    "A100_transient_response_gpudata.csv": (89.0, 92.0, 250.0),
    "V100-SXM2-16GB_pwr_update_freq_gpudata.csv": (87.0, 90.0, 300.0),
}


@dataclass
class ErrorSums:
    """Absolute errors of the forecaster and of persistence at one horizon."""

    forecast: float = 0.0
    persistence: float = 0.0
    n: int = 0

    def add(self, forecast: float, persistence: float, actual: float) -> None:
        """One verdict."""
        self.forecast += abs(forecast - actual)
        self.persistence += abs(persistence - actual)
        self.n += 1

    def merge(self, other: ErrorSums) -> None:
        """Pool another set of verdicts into this one."""
        self.forecast += other.forecast
        self.persistence += other.persistence
        self.n += other.n

    @property
    def mae(self) -> float:
        """The forecaster's mean absolute error."""
        return self.forecast / self.n if self.n else math.nan

    @property
    def mae_persistence(self) -> float:
        """Persistence's mean absolute error."""
        return self.persistence / self.n if self.n else math.nan


@dataclass
class ScenarioScore(DecisionScore):
    """What one scenario replay gave: the shared decision score plus forecast errors."""

    errors: dict[tuple[str, float], ErrorSums] = field(default_factory=dict)
    limit_crossing_s: float | None = None  # inlet or coolant supply first at its limit
    out_at_end: frozenset[str] = frozenset()  # nodes out of service when the run ends
    resumed_expected: tuple[str, ...] = ()

    @property
    def resumed_missing(self) -> int:
        """Expected-resumed nodes still out of service at the end."""
        return len(set(self.resumed_expected) & self.out_at_end)

    @property
    def limit_lead_s(self) -> float | None:
        """Facility limit crossing minus the drain of the last expected node."""
        if self.limit_crossing_s is None or self.drain_s is None:
            return None
        return self.limit_crossing_s - self.drain_s


class _Series:
    """Truth buckets of one slow series and the forecasts made at each bucket close."""

    __slots__ = ("forecasts", "steps", "truth", "window")

    def __init__(self, bucket_s: float) -> None:
        self.steps: tuple[float, ...] = ()  # load steps of a GPU (bucket times)
        self.window = BucketWindow(bucket_s, bucket_s * 2)
        self.truth: list[tuple[float, float]] = []
        self.forecasts: list[tuple[float, float, float, float]] = []  # t, p, f60, f300


def score_scenario(name: str, settings: PolicySettings) -> ScenarioScore:
    """Replay one scenario through the policy and its forecasters."""
    sc = load_scenario(name)
    header, readings = scenario_readings(sc)
    readings_list = list(readings)
    crossing = first_crossing(sc, readings_list)
    limit_crossing = None
    for r in readings_list:
        rack = r.labels.get("rack", "")
        limit = {
            SensorKind.INLET_TEMPERATURE: settings.inlet_limit(rack),
            SensorKind.COOLANT_SUPPLY_TEMPERATURE: settings.supply_limit(rack),
        }.get(r.kind)
        if limit is not None and r.usable and r.value is not None and r.value >= limit:
            limit_crossing = r.mono
            break
    first: dict[str, float] = {}
    out: set[str] = set()
    for tick in replay_readings(header, readings_list, settings):
        for d in tick.decisions:
            if d.action is not Action.RESUME:
                first.setdefault(d.node, tick.now)
                out.add(d.node)
            else:
                out.discard(d.node)
    score = ScenarioScore(name, onset(sc), crossing, first, sc.expect.drained_nodes)
    score.limit_crossing_s = limit_crossing
    score.out_at_end = frozenset(out)
    score.resumed_expected = sc.expect.resumed_nodes
    score.errors = forecast_errors(header, readings_list, settings)
    score.throttled_gpu_s = throttled_in_service(sc, readings_list, first)
    return score


def _signal(r: Reading) -> str | None:
    return {
        SensorKind.GPU_TEMPERATURE: "gpu margin",
        SensorKind.INLET_TEMPERATURE: "inlet air",
        SensorKind.COOLANT_SUPPLY_TEMPERATURE: "coolant supply",
        SensorKind.COOLANT_FLOW: "coolant flow",
    }.get(r.kind)


def forecast_errors(
    header: Header, readings: list[Reading], settings: PolicySettings
) -> dict[tuple[str, float], ErrorSums]:
    """MAE sums per (signal class, horizon) of the policy's forecasters and of persistence."""
    tracker = Tracker(settings, header.racks)
    series: dict[tuple[str, str, str], _Series] = {}
    for r in readings:
        tracker.observe((r,))
        signal = _signal(r)
        if signal is None or not r.usable or r.value is None:
            continue
        node = r.labels.get("node", "")
        key = (signal, node, r.key if not node else r.labels.get("gpu", ""))
        if signal == "gpu margin":
            gpu = tracker.nodes[node].gpus[key[2]]
            if gpu.slowdown is None or gpu.slowdown.value is None:
                continue
            value = gpu.slowdown.value - r.value
            fc = gpu.margin
        else:
            rack = r.labels["rack"]
            slow = tracker.rack[rack].slow[r.kind][r.key]
            value, fc = r.value, slow.forecaster
        s = series.get(key)
        if s is None:
            s = series[key] = _Series(settings.trend_bucket_s)
        if s.window.add(r.mono, value):
            b = s.window.newest
            assert b is not None
            s.truth.append((b.t, b.value))
            f60, f300 = fc.forecast(60.0, b.value), fc.forecast(300.0, b.value)
            assert f60 is not None and f300 is not None
            s.forecasts.append((b.t, b.value, f60, f300))
            if signal == "gpu margin":
                s.steps = tuple(sorted({*s.steps, *gpu.step_times}))
    out: dict[tuple[str, float], ErrorSums] = {}
    half = settings.trend_bucket_s / 2.0
    for (signal, _, _), s in series.items():
        times = [t for t, _ in s.truth]
        for t, p, f60, f300 in s.forecasts:
            for h, f in ((60.0, f60), (300.0, f300)):
                i = bisect.bisect_left(times, t + h - half)
                if i < len(times) and abs(times[i] - (t + h)) <= half:
                    out.setdefault((signal, h), ErrorSums()).add(f, p, s.truth[i][1])
                    if signal == "gpu margin" and not _near_step(s.steps, t, h, settings):
                        steady = ("gpu margin, steady load", h)
                        out.setdefault(steady, ErrorSums()).add(f, p, s.truth[i][1])
    return out


def _near_step(steps: tuple[float, ...], t: float, h: float, s: PolicySettings) -> bool:
    """A load step lies within the horizon of a forecast made at ``t``, or it is settling."""
    # The power bucket that shows a step closes up to one bucket after the step.
    return any(t - s.load_settle_s - s.trend_bucket_s <= x <= t + h for x in steps)


def real_trace(path: Path, slowdown_c: float, shutdown_c: float, limit_w: float) -> list[Reading]:
    """An nvidia-smi CSV (timestamp, ..., temperature.gpu, ..., power.draw) as GPU readings."""
    labels = MappingProxyType({"node": path.stem, "gpu": "0"})
    out: list[Reading] = []
    with path.open(newline="") as f:
        rows = csv.reader(f)
        next(rows)
        t0: float | None = None
        for row in rows:
            ts = dt.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            wall = ts.replace(tzinfo=dt.UTC).timestamp()
            t0 = wall if t0 is None else t0
            mono = wall - t0
            for sensor, kind, unit, value in (
                ("temperature", SensorKind.GPU_TEMPERATURE, "celsius", float(row[3])),
                ("slowdown_threshold", SensorKind.GPU_SLOWDOWN_THRESHOLD, "celsius", slowdown_c),
                ("shutdown_threshold", SensorKind.GPU_SHUTDOWN_THRESHOLD, "celsius", shutdown_c),
                ("power", SensorKind.GPU_POWER, "watts", float(row[5])),
                ("power_limit", SensorKind.GPU_POWER_LIMIT, "watts", limit_w),
            ):
                out.append(
                    Reading(
                        "gpus",
                        f"gpu0.{sensor}",
                        kind,
                        value,
                        unit,
                        Quality.GOOD,
                        mono,
                        wall,
                        labels=labels,
                    )
                )
    return out


def real_traces() -> Iterator[tuple[str, Header, list[Reading]]]:
    """Every real GPU trace present, as (name, header, readings)."""
    for name, (slow, shut, limit) in REAL_TRACES.items():
        path = GPU_DATA / name
        if path.exists():
            readings = real_trace(path, slow, shut, limit)
            yield name, Header(MappingProxyType({"real": (path.stem,)})), readings


def real_trace_errors(readings: list[Reading], horizon_s: float) -> tuple[float, float, int]:
    """MAE of persistence and of naive extrapolation (slope over the last horizon) on temps."""
    pts = [
        (r.mono, r.value)
        for r in readings
        if r.kind is SensorKind.GPU_TEMPERATURE and r.value is not None
    ]
    e_p = e_n = 0.0
    n = 0
    j = k = 0
    for i, (t, v) in enumerate(pts):
        while j < len(pts) and pts[j][0] < t + horizon_s:
            j += 1
        while k < i and pts[k][0] < t - horizon_s:
            k += 1
        if j >= len(pts) or k >= i or t - pts[k][0] <= 0:
            continue
        actual, before = pts[j][1], pts[k][1]
        assert actual is not None and v is not None and before is not None
        slope = (v - before) / (t - pts[k][0])
        e_p += abs(v - actual)
        e_n += abs(v + slope * horizon_s - actual)
        n += 1
    return (e_p / n if n else math.nan, e_n / n if n else math.nan, n)


def _lead_rows(sc: ScenarioScore, lead: float) -> list[Row]:
    """Drain time and lead against the scenario's target."""
    name = sc.name
    rows: list[Row] = []
    if sc.drain_s is not None and sc.expected:
        rows.append(Row(f"{name}: last expected node drained at", sc.drain_s, "s"))
    if name in FACILITY_EVENTS:
        lead_s = sc.limit_lead_s
        ok = lead_s is not None and lead <= lead_s <= 2 * lead
        value = lead_s if lead_s is not None else math.nan
        label = f"{name}: lead before the facility limit (crossing - drain)"
        rows.append(Row(label, value, "s", "configured lead", lead, "1x-2x lead", ok))
    if sc.crossing_s is None:
        return rows
    lead_s = sc.lead_s
    value = lead_s if lead_s is not None else math.nan
    label = f"{name}: lead time (crossing - drain)"
    if name in SLOW_EVENTS:
        ok = lead_s is not None and lead <= lead_s <= 2 * lead
        rows.append(Row(label, value, "s", "configured lead", lead, "1x-2x lead", ok))
    elif name in FAST_EVENTS or name in BLIND_EVENTS:
        ok = lead_s is not None and lead_s >= FAST_LEAD_S
        rows.append(Row(label, value, "s", target=f">= {FAST_LEAD_S:.0f} s", ok=ok))
        if name in FAST_EVENTS and sc.onset_s is not None:
            after = sc.drain_s - sc.onset_s if sc.drain_s is not None else math.nan
            ok = sc.drain_s is not None and after <= FAST_ACT_S
            label = f"{name}: last node acted on after the flow loss began"
            rows.append(Row(label, after, "s", target=f"<= {FAST_ACT_S:.0f} s", ok=ok))
    else:
        ok = lead_s is not None and lead_s > 0
        rows.append(Row(label, value, "s", "configured lead", lead, "> 0 (before crossing)", ok))
    return rows


def measure(settings: PolicySettings | None = None) -> list[Row]:
    """The scenario table and the forecast skill as rows."""
    s = settings or PolicySettings()
    rows: list[Row] = []
    pooled: dict[tuple[str, float], ErrorSums] = {}
    lead = s.lead_time_s
    for name in list_scenarios():
        sc = score_scenario(name, s)
        for k, e in sc.errors.items():
            pooled.setdefault(k, ErrorSums()).merge(e)
        window = (
            sc.crossing_s - sc.onset_s
            if sc.crossing_s is not None and sc.onset_s is not None
            else None
        )
        if window is not None:
            rows.append(Row(f"{name}: warning window", window, "s"))
        rows += _lead_rows(sc, lead)
        rows.append(
            Row(
                f"{name}: false drains",
                sc.false_drains,
                "nodes",
                target="0",
                ok=sc.false_drains == 0,
            )
        )
        if sc.throttled_gpu_s is not None:
            label = f"{name}: throttled GPU-seconds in service (before the drain)"
            rows.append(Row(label, sc.throttled_gpu_s, "GPU-s", target="0"))
        if sc.resumed_expected:
            missing = sc.resumed_missing
            label = f"{name}: expected resumes still out at the end"
            rows.append(Row(label, missing, "nodes", target="0", ok=missing == 0))
    total: dict[float, ErrorSums] = {}
    unconditional: dict[float, ErrorSums] = {}
    for (signal, h), e in sorted(pooled.items()):
        if signal != "gpu margin, steady load":
            unconditional.setdefault(h, ErrorSums()).merge(e)
        if signal != "gpu margin":  # its steady-load subset is what is pooled
            total.setdefault(h, ErrorSums()).merge(e)
        rows.append(
            Row(
                f"forecast MAE {signal} @{h:.0f}s",
                e.mae,
                "C" if signal != "coolant flow" else "l/min",
                "persistence",
                e.mae_persistence,
            )
        )
    for h, e in sorted(total.items()):
        verdict: bool | None = e.mae <= 0.7 * e.mae_persistence if h == 300.0 else None
        rows.append(
            Row(
                f"forecast MAE slow signals pooled @{h:.0f}s",
                e.mae,
                "",
                "persistence",
                e.mae_persistence,
                "<= 0.70x" if h == 300.0 else "",
                verdict,
            )
        )
    for h, e in sorted(unconditional.items()):
        rows.append(
            Row(
                f"forecast MAE slow signals pooled, load steps included @{h:.0f}s",
                e.mae,
                "",
                "persistence",
                e.mae_persistence,
            )
        )
    for name, header, readings in real_traces():
        drains = sum(
            len([d for d in t.decisions if d.action is not Action.RESUME])
            for t in replay_readings(header, readings, s)
        )
        rows.append(Row(f"real {name}: drains", drains, "", target="0", ok=drains == 0))
        persist, naive, _ = real_trace_errors(readings, 5.0)
        rows.append(Row(f"real {name}: naive trend MAE @5s", naive, "C", "persistence", persist))
        caps = real_trace_caps(header, readings, s)
        rows.append(Row(f"real {name}: false caps", caps, "", target="0", ok=caps == 0))
    return rows + ladder_rows(s)

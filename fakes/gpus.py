"""GPU model presets and the state of one fake GPU, shared by the fake NVML and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field

# NVML_PERF_POLICY_POWER (0) and _THERMAL (1) -> the nvmlClocksEventReason* bits whose
# time they count: the power cap and power brake; the software and hardware thermal slowdown.
VIOLATION_POLICY_BITS: dict[int, int] = {0: 0x004 | 0x080, 1: 0x020 | 0x040}


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Limits of a GPU model as NVML reports them."""

    name: str
    slowdown_c: int
    shutdown_c: int
    max_operating_c: int
    memory_max_c: int
    power_limit_w: float  # the default power-management limit, also NVML's maximum
    idle_power_w: float
    min_power_limit_w: float = 100.0  # NVML's lowest settable limit


# Thresholds and limits as `nvidia-smi -q` reports them on real parts.
# A100 SXM4 80GB: ../shared/data/gpu/nvidia-smi-q-x_A100-SXM4-80GB_telegraf.xml
# (slowdown 89, shutdown 92, max GPU 85, max memory 95, 500 W limit: default = max,
# min 100 W).
# H100 SXM5 80GB: published nvidia-smi output of DGX H100 nodes (700 W board, min 200 W);
# the idle draw matches dcgm-exporter_8xH100_aicr_sample.prom (~66-70 W).
H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    slowdown_c=90,
    shutdown_c=92,
    max_operating_c=87,
    memory_max_c=95,
    power_limit_w=700.0,
    idle_power_w=68.0,
    min_power_limit_w=200.0,
)
A100_SXM4 = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    slowdown_c=89,
    shutdown_c=92,
    max_operating_c=85,
    memory_max_c=95,
    power_limit_w=500.0,
    idle_power_w=62.0,
    min_power_limit_w=100.0,
)

MODELS: dict[str, GpuModel] = {"h100-sxm": H100_SXM, "a100-sxm4": A100_SXM4}


@dataclass(slots=True)
class FakeGpu:
    """Live state of one fake GPU; the simulator writes it, the fake NVML reads it."""

    index: int
    model: GpuModel
    uuid: str
    pci_bus_id: str
    temperature_c: float = 35.0
    memory_temperature_c: float = 40.0
    power_w: float = 70.0
    # The enforced limit: the lowest of the power-management limit and other actors'.
    power_limit_w: float = 0.0
    # The power-management limit (nvmlDeviceSetPowerManagementLimit, nvidia-smi -pl).
    requested_limit_w: float = 0.0
    # A limit from outside the power-management limit (a BMC, an out-of-band cap).
    external_limit_w: float | None = None
    clock_event_reasons: int = 0
    # nvmlDeviceGetViolationStatus counters in ns, by NVML_PERF_POLICY_*: the fake NVML
    # adds the time the matching clock-event bits were set (see advance_violations);
    # a test may also write them, to reset or corrupt a counter.
    violation_ns: dict[int, int] = field(default_factory=dict)
    violation_seen: tuple[float, int] | None = None  # (monotonic s, bits) last advanced
    # Fault controls. `errors` maps a pynvml function name (e.g.
    # "nvmlDeviceGetTemperature") to the NVML_ERROR_* code it raises;
    # `lost` makes every call raise GPU_IS_LOST; `delay_s` makes every call slow.
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.requested_limit_w <= 0:
            self.requested_limit_w = self.model.power_limit_w
        if self.power_limit_w <= 0:
            self.power_limit_w = self.enforced_limit_w()

    def advance_violations(self, now: float) -> None:
        """Add the seconds since the last call to each policy whose bits were set then."""
        seen, self.violation_seen = self.violation_seen, (now, self.clock_event_reasons)
        if seen is None:
            return
        since, bits = seen
        step = max(0, round((now - since) * 1e9))
        for policy, mask in VIOLATION_POLICY_BITS.items():
            if bits & mask:
                self.violation_ns[policy] = self.violation_ns.get(policy, 0) + step

    def follow_enforced(self, watts: float) -> None:
        """Take the enforced limit a simulator reports; one it changed is the new
        power-management limit, as an admin's ``nvidia-smi -pl`` would set it."""
        if watts != self.enforced_limit_w():
            self.requested_limit_w = watts
        self.power_limit_w = watts

    def enforced_limit_w(self) -> float:
        """What the board holds: the lowest of every actor's limit."""
        if self.external_limit_w is None:
            return self.requested_limit_w
        return min(self.requested_limit_w, self.external_limit_w)


def make_gpus(model: GpuModel, count: int, *, node_index: int = 0) -> list[FakeGpu]:
    """`count` GPUs of one model with stable, distinct UUIDs and PCI bus ids."""
    bus_ids = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
    gpus = []
    for i in range(count):
        bus = bus_ids[i % len(bus_ids)] + (i // len(bus_ids))
        uuid = f"GPU-{node_index:08x}-{i:04x}-4000-8000-{(node_index * 64 + i):012x}"
        gpus.append(FakeGpu(index=i, model=model, uuid=uuid, pci_bus_id=f"00000000:{bus:02X}:00.0"))
    return gpus

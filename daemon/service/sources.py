"""Builds the sensor adapters from the config (config modules only describe and validate)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.base import SensorAdapter
from adapters.errors import SourceSetupError
from adapters.sensors.nvml import NvmlAdapter, load_binding
from daemon.config import SourceConfig
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.secrets import read_secret, resolve_secret
from daemon.config.snmp import SnmpSourceConfig

if TYPE_CHECKING:  # pysnmp and asyncua are imported only when such a source is configured
    from adapters.sensors.opcua import OpcuaAdapter, OpcuaSettings
    from adapters.sensors.snmp import SnmpAdapter
    from adapters.sensors.snmp_client import SnmpClient


def build_adapter(name: str, cfg: SourceConfig, *, nvml: Any = None) -> SensorAdapter:
    """The adapter for one configured source.

    ``nvml`` is an NVML binding injected by the demo and the tests (a simulated
    node); production passes None and reads nvidia-ml-py's ``pynvml``, never a
    module the config names.
    """
    if isinstance(cfg, OpcuaSourceConfig):
        return build_opcua_adapter(name, cfg)
    if isinstance(cfg, SnmpSourceConfig):
        return build_snmp_adapter(name, cfg)
    binding = nvml if nvml is not None else load_binding(cfg.binding)
    return NvmlAdapter(name, binding, gpu_indices=cfg.gpus or None)


# --- SNMP ---------------------------------------------------------------------------


def _read(path: Path, key: str) -> bytes:
    """A secret's bytes; SourceSetupError naming the key if the file went away."""
    try:
        return read_secret(path)
    except OSError as err:
        raise SourceSetupError(f"{key}: {str(path)!r} cannot be read: {err}") from err


def snmp_client(cfg: SnmpSourceConfig) -> SnmpClient:
    """The SNMP session the config asks for, with its secrets read from their files."""
    from adapters.sensors.snmp_client import V2cClient, V3Client, V3Credentials  # noqa: PLC0415

    if cfg.version == "2c":
        assert cfg.community_file is not None  # validate() guarantees it
        return V2cClient(
            cfg.host,
            cfg.port,
            _read(cfg.community_file, "community_file"),
            timeout_s=cfg.request_timeout_s,
            retries=cfg.retries,
        )
    assert cfg.auth_key_file is not None
    creds = V3Credentials(
        user=cfg.user,
        auth_protocol=cfg.auth_protocol,
        auth_key=_read(cfg.auth_key_file, "auth_key_file"),
        priv_protocol=cfg.priv_protocol,
        priv_key=b"" if cfg.priv_key_file is None else _read(cfg.priv_key_file, "priv_key_file"),
    )
    return V3Client(cfg.host, cfg.port, creds, timeout_s=cfg.request_timeout_s, retries=cfg.retries)


def build_snmp_adapter(name: str, cfg: SnmpSourceConfig) -> SnmpAdapter:
    """The adapter for one configured SNMP source."""
    from adapters.sensors.snmp import SnmpAdapter, SnmpOptions  # noqa: PLC0415

    options = SnmpOptions(
        max_varbinds=cfg.max_varbinds,
        max_repetitions=cfg.max_repetitions,
        poll_deadline_s=cfg.poll_deadline_s,
        profile=cfg.profile,
        profile_dir=cfg.profile_dir,
        probe_positions=dict(cfg.probe_positions),
    )
    return SnmpAdapter(name, snmp_client(cfg), options)


# --- OPC-UA -------------------------------------------------------------------------


def _secret_reader(path: Path | None) -> Callable[[], str] | None:
    """Reads the secret at every connect, so a rotated password needs no restart."""
    if path is None:
        return None

    def read() -> str:
        try:
            return read_secret(path).decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SourceSetupError(f"secret file {str(path)!r} cannot be read: {err}") from err

    return read


def opcua_settings(cfg: OpcuaSourceConfig) -> OpcuaSettings:
    """The adapter's settings for one configured source (the profile is loaded here)."""
    from adapters.sensors.opcua import OpcuaSettings  # noqa: PLC0415
    from adapters.sensors.opcua_session import SecuritySettings, SessionSettings  # noqa: PLC0415

    session = SessionSettings(
        url=cfg.url,
        request_timeout_s=cfg.request_timeout_s,
        security=SecuritySettings(
            policy=cfg.security_policy,
            mode=cfg.security_mode,
            certificate=cfg.certificate_file,
            private_key=None
            if cfg.private_key_file is None
            else resolve_secret(cfg.private_key_file),
            private_key_password=_secret_reader(cfg.private_key_password_file),
            server_certificate=cfg.server_certificate_file,
        ),
        username=cfg.username or None,
        password=_secret_reader(cfg.password_file),
    )
    return OpcuaSettings(
        session=session,
        profile=cfg.effective_profile(),
        mode=cfg.mode,
        sampling_interval_s=cfg.sampling_interval_s,
        deadband=cfg.deadband,
        keepalive_s=cfg.keepalive_s,
        stale_after_s=cfg.stale_after_s,
        bad_after_s=cfg.bad_after_s,
        root=cfg.root,
        nodes=dict(cfg.nodes),
        namespaces=dict(cfg.namespaces),
        variables=tuple(cfg.variables),
    )


def build_opcua_adapter(name: str, cfg: OpcuaSourceConfig) -> OpcuaAdapter:
    """The adapter for one ``type = "opcua"`` source."""
    from adapters.sensors.opcua import OpcuaAdapter  # noqa: PLC0415

    return OpcuaAdapter(name, opcua_settings(cfg))

"""A fake CDU: a real asyncua OPC-UA server whose values follow the thermal simulator.

With the OPC 40082-1 TCD nodesets (``../shared/data/opcua``) it serves a
Temperature Control Device instance (DeviceZone_1 + Operation, the model the
``opc40082-tcd`` profile reads); without them it builds the ``generic`` profile's
object model in code, so the demo runs on any clone. Values come from
:meth:`FakeCduServer.publish` (a ``CduSnapshot``), or :meth:`follow` in a loop.

Fault controls: :meth:`restart` (stop and start on the same port, optionally with
new NodeIds), :meth:`stall` (no value updates and no publish responses, while the
connection stays up and Reads are answered), :meth:`set_status` (a Bad/Uncertain
status code on one variable), ``slow_s`` (every Read answered that much later),
``refuse_subscriptions``, ``refuse_items`` and ``refuse_filters`` (a Bad result for
some monitored items),
``revise_keepalive_count`` and ``operation_limits`` (fakes/opcua_limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, Literal

from asyncua import ua
from asyncua.common.callback import CallbackType, ServerItemCallback
from asyncua.common.instantiate_util import instantiate
from asyncua.common.node import Node
from asyncua.common.utils import ServiceError
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.internal_server import InternalServer
from asyncua.server.server import Server
from asyncua.server.user_managers import UserManager
from asyncua.ua.status_codes import StatusCodes
from asyncua.ua.uaerrors import UaError
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from adapters.sensors.opcua_profiles import unece_code
from fakes.opcua_limits import OperationLimits, limit_operations
from fakes.opcua_space import init_server
from fakes.sim.thermal import CduSnapshot

log = logging.getLogger(__name__)

CDU_NAMESPACE = "urn:rackguard:cdu"
TCD_NAMESPACE = "http://opcfoundation.org/UA/PlasticsRubber/TCD/"
GT_NAMESPACE = "http://opcfoundation.org/UA/PlasticsRubber/GeneralTypes/"
TCD_NODESETS = (
    "Opc.Ua.Di.NodeSet2.xml",
    "Opc.Ua.PlasticsRubber.GeneralTypes.NodeSet2.xml",  # 1.03: 1.02 fails in asyncua
    "Opc.Ua.PlasticsRubber.TCD.NodeSet2.xml",
)
DEFAULT_NODESET_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "opcua"
_DEVICE_ZONE_TYPE = 1008
_OPERATION_TYPE = 1010
PUMP_RPM_AT_100_PCT = 3000.0
ALARM_SEVERITY = 800  # HighestActiveAlarmSeverity while the CDU alarm is on (TCD model)

Model = Literal["auto", "tcd", "generic"]
Security = Literal["None", "Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt"]


@dataclass(frozen=True, slots=True)
class _Var:
    """How one CDU signal appears in a model: path below CDU-1, type, unit and scaling."""

    key: str
    path: tuple[tuple[str, str], ...]  # (namespace URI, browse name) below the CDU object
    vtype: ua.VariantType
    unit: str = ""  # UN/CEFACT code for EngineeringUnits; "" = none
    scale: float = 1.0  # server value = simulator value * scale


_GENERIC: tuple[_Var, ...] = (
    _Var(
        "supply_temperature", ((CDU_NAMESPACE, "SupplyTemperature"),), ua.VariantType.Double, "CEL"
    ),
    _Var(
        "return_temperature", ((CDU_NAMESPACE, "ReturnTemperature"),), ua.VariantType.Double, "CEL"
    ),
    _Var("flow", ((CDU_NAMESPACE, "Flow"),), ua.VariantType.Double, "L2"),
    _Var(
        "differential_pressure",
        ((CDU_NAMESPACE, "DifferentialPressure"),),
        ua.VariantType.Double,
        "KPA",
    ),
    _Var("pump_speed", ((CDU_NAMESPACE, "PumpSpeed"),), ua.VariantType.Double, "P1"),
    _Var("pump_state", ((CDU_NAMESPACE, "PumpRunning"),), ua.VariantType.Boolean),
    _Var("leak", ((CDU_NAMESPACE, "Leak"),), ua.VariantType.Boolean),
    _Var("alarm", ((CDU_NAMESPACE, "Alarm"),), ua.VariantType.Boolean),
)
_ZONE = (TCD_NAMESPACE, "DeviceZone_1")
_TCD: tuple[_Var, ...] = (
    _Var(
        "supply_temperature",
        (_ZONE, (TCD_NAMESPACE, "TemperatureMainLine")),
        ua.VariantType.Double,
        "CEL",
    ),
    _Var(
        "return_temperature",
        (_ZONE, (TCD_NAMESPACE, "TemperatureReturnLine")),
        ua.VariantType.Double,
        "CEL",
    ),
    _Var(
        "flow",
        (_ZONE, (TCD_NAMESPACE, "FlowRate"), (GT_NAMESPACE, "ActualValue")),
        ua.VariantType.Double,
        "L2",
    ),
    # In bar, as real TCDs report it: the adapter must convert to kPa.
    _Var(
        "differential_pressure",
        (_ZONE, (TCD_NAMESPACE, "PressureDifference"), (GT_NAMESPACE, "ActualValue")),
        ua.VariantType.Double,
        "BAR",
        0.01,
    ),
    _Var(
        "pump_speed",
        (_ZONE, (TCD_NAMESPACE, "PumpSpeed"), (GT_NAMESPACE, "ActualValue")),
        ua.VariantType.Double,
        "P1",
    ),
    _Var(
        "pump_state",
        (_ZONE, (TCD_NAMESPACE, "ActualPumpSpeedRPM")),
        ua.VariantType.Double,
        scale=PUMP_RPM_AT_100_PCT / 100.0,
    ),
    _Var(
        "alarm",
        ((TCD_NAMESPACE, "Operation"), (TCD_NAMESPACE, "HighestActiveAlarmSeverity")),
        ua.VariantType.UInt16,
    ),
)


def _nid(identifier: str, ns: int) -> ua.NodeId:
    """A string NodeId in namespace ``ns``."""
    return ua.NodeId(ua.String(identifier), ua.Int16(ns))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def nodesets_available(folder: Path = DEFAULT_NODESET_DIR) -> bool:
    """True when the TCD nodesets (and their dependencies) are in ``folder``."""
    return all((folder / name).is_file() for name in TCD_NODESETS)


class _PasswordUsers(UserManager):
    """asyncua UserManager: the given username/password pairs, nobody else."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = dict(users)

    def get_user(
        self,
        iserver: InternalServer,
        username: str | None = None,
        password: str | None = None,
        certificate: Any = None,
    ) -> User | None:
        if username is not None and self._users.get(username) == password:
            return User(role=UserRole.User, name=username)
        return None


def _values(cdu: CduSnapshot) -> dict[str, float]:
    """Simulator CDU values by signal key (bools as 1/0)."""
    return {
        "supply_temperature": cdu.supply_c,
        "return_temperature": cdu.return_c,
        "flow": cdu.flow_lpm,
        "differential_pressure": cdu.differential_pressure_kpa,
        "pump_speed": cdu.pump_speed_pct,
        "pump_state": cdu.pump_speed_pct if cdu.pump_running else 0.0,
        "leak": 1.0 if cdu.leak else 0.0,
        "alarm": 1.0 if cdu.alarm else 0.0,
    }


class FakeCduServer:
    """An OPC-UA server on loopback exposing one CDU; start() it, stop() it when done."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: Model = "auto",
        nodeset_dir: Path = DEFAULT_NODESET_DIR,
        security: Sequence[Security] = ("None",),
        certificate: Path | None = None,
        private_key: Path | None = None,
        users: Mapping[str, str] | None = None,
        trusted_clients: Sequence[Path] | None = None,
        operation_limits: OperationLimits | None = None,
    ) -> None:
        if model == "auto":
            model = "tcd" if nodesets_available(nodeset_dir) else "generic"
        self.model: Literal["tcd", "generic"] = model
        self.host = host
        self.port = port or free_port(host)
        self._nodeset_dir = nodeset_dir
        self._security = tuple(security)
        self._certificate = certificate
        self._private_key = private_key
        self._users = users
        self._trusted: list[bytes] | None = None
        self._trusted_paths = list(trusted_clients) if trusted_clients is not None else None
        self._server: Server | None = None
        self._generation = 0
        self._nodes: dict[str, Node] = {}
        self._vars = _TCD if model == "tcd" else _GENERIC
        self._last: dict[str, float] = {}
        self._status: dict[str, int] = {}
        self.stalled = False
        self.slow_s = 0.0
        self.refuse_subscriptions = False
        self.refuse_items: dict[str, str] = {}  # key -> status name for its monitored item
        self.refuse_filters = False  # BadMonitoredItemFilterUnsupported for any filter
        self.revise_keepalive_count = 0  # > 0: the server's revised MaxKeepAliveCount
        self.publishes = 0  # values written since start
        self.operation_limits = operation_limits  # stated and enforced; requests counted

    @property
    def url(self) -> str:
        """The endpoint URL clients connect to."""
        return f"opc.tcp://{self.host}:{self.port}/rackguard/cdu"

    @property
    def keys(self) -> tuple[str, ...]:
        """The signals this model serves."""
        return tuple(v.key for v in self._vars)

    def node_id(self, key: str) -> str:
        """The NodeId of one signal's variable, as a string (ns=...;...)."""
        return self._nodes[key].nodeid.to_string()

    async def start(self) -> None:
        """Build the address space and listen."""
        if self._server is None:
            self._server = await self._build()
        await self._server.start()
        log.info("fake CDU (%s model) listening on %s", self.model, self.url)

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop()
        # Transports close on the next loop turns; let their cleanup tasks start and end.
        for _ in range(3):
            await asyncio.sleep(0)
        # A session with subscriptions outlives its connection (Part 4 6.7) and keeps its
        # tasks running until it times out; a stopped process has none: close them all.
        sessions = getattr(server.iserver, "_external_sessions", {})
        for session in list(sessions.values()):
            await session.close_session(True)
        for _ in range(3):
            await asyncio.sleep(0)

    async def restart(self, *, change_node_ids: bool = False, downtime_s: float = 0.0) -> None:
        """Stop, wait ``downtime_s``, start again on the same port (a fresh process's state).

        With ``change_node_ids`` the CDU object is rebuilt with new NodeIds (same browse
        names), as after a server reconfiguration or an upgrade.
        """
        await self.stop()
        if downtime_s > 0:
            await asyncio.sleep(downtime_s)
        if change_node_ids:
            self._generation += 1
        await self.start()

    def stall(self, stalled: bool = True) -> None:
        """Stop (or resume) value updates and publish responses; the connection stays open."""
        self.stalled = stalled

    async def set_status(self, key: str, status: str | None) -> None:
        """Serve ``key`` with a status code (e.g. "BadSensorFailure"); None means Good again."""
        if status is None:
            self._status.pop(key, None)
        else:
            self._status[key] = getattr(StatusCodes, status)
        if key in self._last:
            await self._write(key, self._last[key])

    async def publish(self, cdu: CduSnapshot) -> None:
        """Write the snapshot's values (unless stalled), stamped now."""
        if self.stalled or self._server is None:
            return
        for key, value in _values(cdu).items():
            if key in self._nodes:
                await self._write(key, value)
        self.publishes += 1

    async def follow(self, snapshot: Callable[[], CduSnapshot], period_s: float) -> None:
        """Publish ``snapshot()`` every ``period_s`` until cancelled (for the demo).

        While the simulated unit is silent (the ``cdu_silent`` event) the server stalls.
        """
        silenced = False
        while True:
            snap = snapshot()
            if snap.answering == silenced:  # the simulated unit went silent or came back
                silenced = not snap.answering
                self.stall(silenced)
            await self.publish(snap)
            await asyncio.sleep(period_s)

    # --- building --------------------------------------------------------------------

    async def _build(self) -> Server:
        server = Server()
        await init_server(server)
        server.disable_clock(True)  # else stop() waits up to 1 s for the clock task
        server.set_endpoint(self.url)
        server.set_server_name("rackguard fake CDU")
        await self._setup_security(server)
        if self.model == "tcd":
            for name in TCD_NODESETS:
                await server.import_xml(str(self._nodeset_dir / name))
        idx = await server.register_namespace(CDU_NAMESPACE)
        ns = {uri: i for i, uri in enumerate(await server.get_namespace_array())}
        prefix = f"g{self._generation}." if self._generation else ""
        cdu = await server.nodes.objects.add_object(
            _nid(f"{prefix}CDU-1", idx), ua.QualifiedName("CDU-1", idx)
        )
        if self.model == "tcd":
            await self._build_tcd(server, cdu, ns, idx, prefix)
        else:
            await self._build_generic(cdu, idx, prefix)
        await self._add_units(server, idx, prefix)
        server.iserver.max_subscriptions = 1_000
        self._gate_subscriptions(server)
        server.subscribe_server_callback(CallbackType.PreRead, self._slow_read)
        if self.operation_limits is not None:
            await limit_operations(server, self.operation_limits)
        for key, value in self._last.items():
            await self._write(key, value, server)
        return server

    async def _build_generic(self, cdu: Node, idx: int, prefix: str) -> None:
        self._nodes = {}
        for v in self._vars:
            name = v.path[-1][1]
            initial: Any = False if v.vtype is ua.VariantType.Boolean else 0.0
            self._nodes[v.key] = await cdu.add_variable(
                _nid(f"{prefix}CDU-1.{name}", idx),
                ua.QualifiedName(name, idx),
                initial,
                v.vtype,
            )

    async def _build_tcd(
        self, server: Server, cdu: Node, ns: Mapping[str, int], idx: int, prefix: str
    ) -> None:
        tcd = ns[TCD_NAMESPACE]
        for type_id, name in ((_DEVICE_ZONE_TYPE, "DeviceZone_1"), (_OPERATION_TYPE, "Operation")):
            await instantiate(
                cdu,
                server.get_node(ua.NodeId.from_string(f"ns={tcd};i={type_id}")),
                nodeid=_nid(f"{prefix}CDU-1.{name}", idx),
                bname=ua.QualifiedName(name, tcd),
                idx=idx,
                instantiate_optional=True,
            )
        self._nodes = {}
        for v in self._vars:
            node = cdu
            for uri, name in v.path:
                node = await node.get_child(ua.QualifiedName(name, ns[uri]))
            self._nodes[v.key] = node

    async def _add_units(self, server: Server, idx: int, prefix: str) -> None:
        """EngineeringUnits on every variable that has a unit (added, or set if the type has it)."""
        for v in self._vars:
            if not v.unit:
                continue
            eu = ua.EUInformation(
                NamespaceUri="http://www.opcfoundation.org/UA/units/un/cefact",
                UnitId=unece_code(v.unit),
                DisplayName=ua.LocalizedText(v.unit),
                Description=ua.LocalizedText(v.unit),
            )
            node = self._nodes[v.key]
            try:
                prop = await node.get_child(ua.QualifiedName("EngineeringUnits", 0))
            except UaError:
                await node.add_property(
                    _nid(f"{prefix}{v.key}.EngineeringUnits", idx),
                    ua.QualifiedName("EngineeringUnits", 0),
                    eu,
                )
            else:
                await server.write_attribute_value(prop.nodeid, ua.DataValue(ua.Variant(eu)))

    async def _setup_security(self, server: Server) -> None:
        policies = {
            "None": ua.SecurityPolicyType.NoSecurity,
            "Basic256Sha256_Sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
            "Basic256Sha256_SignAndEncrypt": ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
        }
        server.set_security_policy([policies[s] for s in self._security])
        if self._certificate is not None and self._private_key is not None:
            await server.load_certificate(str(self._certificate))
            await server.load_private_key(str(self._private_key))
        if self._users is not None:
            server.iserver.user_manager = _PasswordUsers(self._users)
            server.set_identity_tokens([ua.UserNameIdentityToken])
        else:
            server.set_identity_tokens([ua.AnonymousIdentityToken])
        if self._trusted_paths is not None:
            self._trusted = []
            for path in self._trusted_paths:
                data = path.read_bytes()
                cert = (
                    x509.load_pem_x509_certificate(data)
                    if b"-----BEGIN" in data
                    else x509.load_der_x509_certificate(data)
                )
                self._trusted.append(cert.public_bytes(serialization.Encoding.DER))
            server.set_certificate_validator(self._validate_client)

    async def _validate_client(self, cert: Any, app: ua.ApplicationDescription) -> None:
        if (
            self._trusted is not None
            and cert.public_bytes(serialization.Encoding.DER) not in self._trusted
        ):
            raise ServiceError(StatusCodes.BadCertificateUntrusted)

    def _gate_subscriptions(self, server: Server) -> None:
        """Refuse subscriptions, and hold back publish responses while stalled."""
        service = server.iserver.subscription_service
        create = service.create_subscription

        async def create_subscription(
            params: ua.CreateSubscriptionParameters,
            callback: Callable[..., Awaitable[None]],
            session_id: ua.NodeId,
            request_callback: Callable[[int], Any] | None = None,
        ) -> ua.CreateSubscriptionResult:
            if self.refuse_subscriptions:
                raise ServiceError(StatusCodes.BadTooManySubscriptions)
            if self.revise_keepalive_count:
                params.RequestedMaxKeepAliveCount = self.revise_keepalive_count
                params.RequestedLifetimeCount = max(
                    params.RequestedLifetimeCount, 3 * self.revise_keepalive_count
                )
            gated: Callable[[int], Any] | None = None
            if request_callback is not None:
                inner = request_callback

                def gated(subscription_id: int) -> Any:
                    # No publish request to answer with: nothing is sent, not even keep-alives.
                    return None if self.stalled else inner(subscription_id)

            return await create(params, callback, session_id, request_callback=gated)

        service.create_subscription = create_subscription  # type: ignore[method-assign]
        create_items = service.create_monitored_items

        async def create_monitored_items(
            params: ua.CreateMonitoredItemsParameters,
        ) -> list[ua.MonitoredItemCreateResult]:
            wanted = params.ItemsToCreate
            refusals = [self._refusal(i) for i in wanted]
            params.ItemsToCreate = [i for i, r in zip(wanted, refusals, strict=True) if not r]
            created = iter(await create_items(params) if params.ItemsToCreate else [])
            return [
                ua.MonitoredItemCreateResult(StatusCode=ua.StatusCode(getattr(StatusCodes, r)))
                if r
                else next(created)
                for r in refusals
            ]

        service.create_monitored_items = create_monitored_items  # type: ignore[method-assign]

    def _refusal(self, item: ua.MonitoredItemCreateRequest) -> str:
        """The Bad status this server answers for a monitored item; "" to create it."""
        flt = item.RequestedParameters.Filter
        # A null filter arrives as an ExtensionObject without a body.
        if self.refuse_filters and not (flt is None or getattr(flt, "Body", flt) is None):
            return "BadMonitoredItemFilterUnsupported"
        for key, code in self.refuse_items.items():
            if self._nodes[key].nodeid == item.ItemToMonitor.NodeId:
                return code
        return ""

    async def _slow_read(self, event: ServerItemCallback, _dispatcher: Any) -> None:
        if self.slow_s > 0 and event.is_external:
            await asyncio.sleep(self.slow_s)

    async def _write(self, key: str, value: float, server: Server | None = None) -> None:
        server = server or self._server
        if server is None:
            return
        self._last[key] = value
        spec = next(v for v in self._vars if v.key == key)
        raw: Any
        if spec.vtype is ua.VariantType.Boolean:
            raw = value != 0
        elif spec.vtype is ua.VariantType.UInt16:
            raw = ALARM_SEVERITY if value else 0
        else:
            raw = value * spec.scale
        now = ua.DateTime.now(UTC)
        status = ua.StatusCode(ua.UInt32(self._status.get(key, StatusCodes.Good)))
        await server.write_attribute_value(
            self._nodes[key].nodeid,
            ua.DataValue(
                Value=ua.Variant(raw, spec.vtype),
                StatusCode=status,
                SourceTimestamp=now,
                ServerTimestamp=now,
            ),
        )

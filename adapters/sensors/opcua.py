"""OPC-UA adapter for a coolant distribution unit (CDU): subscriptions, batched Read fallback.

connect() opens a session (opcua_session.py), resolves every variable -- by browse
path from the root object, or by a configured NodeId -- together with its
EngineeringUnits, and in subscription mode creates one data-change subscription
seeded by one batched Read. Browse paths and namespace indexes are resolved again
at every connect, so a server that restarted with new NodeIds is followed.

read() in subscription mode returns the latest value of each variable. Any publish
response (a data change or a keep-alive) proves the values current; when the server
falls silent they turn UNCERTAIN after ``stale_after_s`` and BAD after
``bad_after_s``, and the read after that raises SourceUnavailable so the runner
rebuilds the session. A closed connection raises at once. In poll mode (or when the
server refuses subscriptions) each read is one Read call for all variables.

Every multi-node request (Read, TranslateBrowsePathsToNodeIds, CreateMonitoredItems)
fits the server's OperationLimits (opcua_limits.py). A monitored item refused for
its filter is asked again without one; a variable whose item is still refused is
read at every read() instead. A revised keep-alive
(publishing interval x keep-alive count) longer than ``stale_after_s`` raises the
stale limit to 1.5 x it; longer than ``bad_after_s``, the adapter polls.

OPC-UA status codes map to quality: Good -> GOOD, Uncertain* -> UNCERTAIN, Bad* ->
BAD, each with the code's name as the reason. ``device_ts`` is the SourceTimestamp,
or the ServerTimestamp when the server sends no SourceTimestamp; ``server_ts`` is the
ServerTimestamp. A null DateTime (0, which asyncua shows as 1601-01-01) is None.

A profile variable the server does not have (its browse path not found) is ABSENT,
not BAD: connect logs it once with how to map it (``nodes.KEY`` / ``paths.KEY``) or
leave it out (``variables``); ``notes`` carries the same for ``rackguard probe``.
Units come from the variable's EngineeringUnits (EUInformation) when the server
publishes them, converted to rackguard's unit (bar -> kPa, degF -> degC, rpm kept
as rpm for pump speed); else the profile's unit, said once in the log.
"""

from __future__ import annotations

import logging
import math
import time
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from asyncua import ua
from asyncua.client.client import Client
from asyncua.client.ua_client import UaClientState
from asyncua.ua.attribute_ids import AttributeIds
from asyncua.ua.object_ids import ObjectIds
from asyncua.ua.status_codes import StatusCodes
from asyncua.ua.uaerrors import UaError, UaStatusCodeError

from adapters.errors import SourceSetupError, SourceUnavailable
from adapters.sensors.opcua_limits import OperationLimits, read_operation_limits
from adapters.sensors.opcua_profiles import (
    UNITS_BY_UNECE,
    CduProfile,
    PathElement,
    Unit,
    VariableSpec,
    kind_range,
    parse_path,
    unit_fits,
)
from adapters.sensors.opcua_session import (
    SessionSettings,
    close_session,
    open_session,
    renew_channel_if_due,
    status_name,
    translate_error,
)
from policies.model import Quality, Reading

log = logging.getLogger(__name__)

Mode = Literal["subscription", "poll"]

# CreateSubscription results after which polling is the way to read this server.
_SUBSCRIPTIONS_REFUSED = frozenset(
    {
        StatusCodes.BadTooManySubscriptions,
        StatusCodes.BadServiceUnsupported,
        StatusCodes.BadNotSupported,
        StatusCodes.BadNotImplemented,
        StatusCodes.BadUserAccessDenied,
    }
)
_GOOD = StatusCodes.Good
# CreateMonitoredItems results that refuse the filter, not the variable.
_FILTER_REFUSED = frozenset(
    {
        StatusCodes.BadMonitoredItemFilterUnsupported,
        StatusCodes.BadMonitoredItemFilterInvalid,
        StatusCodes.BadFilterNotAllowed,
        StatusCodes.BadDeadbandFilterInvalid,
    }
)
_SEVERITY_MASK = 0xC0000000
_UNCERTAIN = 0x40000000
_ENGINEERING_UNITS = PathElement("0", "EngineeringUnits")
_MIN_SUBSCRIPTION_LIFETIME_S = 60.0  # the server keeps our subscription this long without us
# A healthy subscription over steady values is silent for up to one keep-alive period
# (publishing interval x keep-alive count); allow this much more before calling it stale.
_KEEPALIVE_MARGIN = 1.5


@dataclass(frozen=True, slots=True)
class OpcuaSettings:
    """Everything the adapter needs; built from the config by daemon/config/opcua.py."""

    session: SessionSettings
    profile: CduProfile
    mode: Mode = "subscription"
    sampling_interval_s: float = 1.0
    deadband: float = 0.0  # absolute, in the server's unit; analog variables only
    keepalive_s: float = 5.0
    stale_after_s: float = 15.0
    bad_after_s: float = 30.0
    root: str = (
        ""  # browse path ("alias:Name/...") or NodeId ("ns=2;s=X", "nsu=URI;s=X"); "" = profile's
    )
    nodes: Mapping[str, str] = field(
        default_factory=dict
    )  # variable key -> NodeId, instead of a path
    namespaces: Mapping[str, str] = field(default_factory=dict)  # alias -> URI, over the profile's
    variables: tuple[str, ...] = ()  # profile keys to read; () = all


@dataclass(slots=True)
class _Var:
    """One variable's address, unit and latest sample."""

    spec: VariableSpec
    sensor: str
    labels: Mapping[str, str]
    node_id: ua.NodeId | None = None
    fault: str = ""  # why the variable cannot be read at all; "" when it can
    missing: bool = False  # the server has no such variable (ABSENT, not BAD)
    polled: bool = False  # its monitored item was refused: read by every read() instead
    unit: Unit | None = None
    value: Any = None
    status: int = StatusCodes.BadWaitingForInitialData
    source_ts: float | None = None
    server_ts: float | None = None


def _epoch(ts: datetime | None) -> float | None:
    """Seconds since 1970; None for no timestamp or OPC-UA's null DateTime (1601-01-01)."""
    if ts is None or ts.year <= 1601:  # node-opcua sends 0 = 1601-01-01 for "none"
        return None
    if ts.tzinfo is None:  # OPC-UA DateTime is UTC
        ts = ts.replace(tzinfo=UTC)
    return ts.timestamp()


def _plain(node_id: ua.NodeId) -> ua.NodeId:
    """An ExpandedNodeId from TranslateBrowsePaths as a plain NodeId."""
    return ua.NodeId(node_id.Identifier, node_id.NamespaceIndex, node_id.NodeIdType)


class OpcuaAdapter:
    """SensorAdapter for one CDU over OPC-UA; see the module docstring for the contract."""

    def __init__(self, name: str, settings: OpcuaSettings) -> None:
        self.name = name
        self.settings = settings
        profile = settings.profile
        keys = settings.variables or tuple(v.key for v in profile.variables)
        unknown = [k for k in keys if k not in {v.key for v in profile.variables}]
        if unknown:
            raise SourceSetupError(
                f"{name}: variables {unknown} are not in profile {profile.name!r}"
            )
        self._specs = tuple(profile.variable(k) for k in keys)
        self._aliases = {**profile.namespaces, **settings.namespaces}
        self._client: Client | None = None
        self._vars: list[_Var] = []
        self._polling = settings.mode == "poll"
        self._read_vars: list[_Var] = []  # every variable a poll reads
        # What each read() asks the server for, fixed at connect: every variable when
        # polling, else those whose monitored item was refused (usually none).
        self._poll_vars: list[_Var] = []
        self.limits = OperationLimits()  # the server's, read at connect; requests counted
        self._channel_opened = 0.0
        self._heard = 0.0  # monotonic time of the last publish response (data or keep-alive)
        self._lost = ""  # why the session must be rebuilt; "" while it is usable
        self._refused_logged = False
        self._stale_after_s = settings.stale_after_s  # raised to the server's revised keep-alive
        self._said: set[str] = set()  # subscription notes already logged
        self._subscription_notes: list[str] = []
        self._logged_missing: frozenset[str] = frozenset()
        self._logged_default_units: set[str] = set()
        self.notes: list[str] = []  # what an operator should know after connect (for probe)
        self.notifications = 0  # data-change notifications received (for stats and benches)
        self.channel_renewals = 0

    @property
    def polling(self) -> bool:
        """True when reads are batched Read calls (configured, or subscriptions were refused)."""
        return self._polling

    @property
    def url(self) -> str:
        """The server's endpoint URL."""
        return self.settings.session.url

    async def connect(self) -> None:
        """Open a session, resolve the variables and (in subscription mode) subscribe."""
        await self.close()
        client = await open_session(self.settings.session)
        try:
            self.limits = self._carry_learnt(await read_operation_limits(client))
            self._vars = await self._resolve(client)
            self._read_vars = [v for v in self._vars if v.node_id is not None and not v.fault]
            self._lost = ""
            self._polling = self.settings.mode == "poll"
            self._stale_after_s = self.settings.stale_after_s
            self._subscription_notes = []
            self._channel_opened = time.monotonic()
            if not self._polling:
                await self._subscribe(client)
            self._poll_vars = (
                self._read_vars if self._polling else [v for v in self._read_vars if v.polled]
            )
        except (OSError, TimeoutError, UaError) as err:
            await close_session(client)
            raise translate_error(self.url, "resolving variables", err) from err
        except BaseException:
            await close_session(client)
            raise
        self._client = client
        self._log_missing()
        self.notes.extend(self._subscription_notes)

    def _carry_learnt(self, fresh: OperationLimits) -> OperationLimits:
        """Keep what the last session learnt from BadTooManyOperations while the server states
        the same limits, so a reconnect costs no refused requests and logs nothing again."""
        if fresh.stated == self.limits.stated:
            fresh.learnt = {**self.limits.learnt, **fresh.learnt}
        fresh.requests = self.limits.requests
        return fresh

    def _log_missing(self) -> None:
        """Say once (and on change) which profile variables the server lacks, and what to do."""
        missing = [v for v in self._vars if v.missing]
        keys = frozenset(v.spec.key for v in missing)
        self.notes = []
        if missing:
            listed = "; ".join(f"{v.spec.key} ({v.fault})" for v in missing)
            kept = ", ".join(repr(v.spec.key) for v in self._vars if not v.missing)
            self.notes.append(
                f"profile {self.settings.profile.name!r}: not found on {self.url}: {listed}."
                ' Map each in the source\'s config with nodes.KEY = "ns=...;s=..." or'
                f' paths.KEY = "alias:Name/...", or leave it out with variables = [{kept}]'
            )
            if keys != self._logged_missing:
                log.warning("%s: %s", self.name, self.notes[-1])
        self._logged_missing = keys

    async def read(self) -> Sequence[Reading]:
        """One reading per variable; SourceUnavailable when the session is gone."""
        client = self._client
        if client is None:
            raise SourceUnavailable(f"{self.name}: not connected to {self.url}")
        if client.uaclient.state is not UaClientState.CONNECTED:
            raise SourceUnavailable(f"{self.name}: connection to {self.url} lost")
        if self._lost:
            raise SourceUnavailable(f"{self.name}: {self._lost}")
        try:
            if await renew_channel_if_due(client, self._channel_opened, time.monotonic()):
                self._channel_opened = time.monotonic()
                self.channel_renewals += 1
            await self._poll(client, self._poll_vars)
        except (OSError, TimeoutError, UaError) as err:
            raise translate_error(self.url, "read", err) from err
        return self._readings()

    async def close(self) -> None:
        """Close the session (politely if the server answers quickly); never raises."""
        client, self._client = self._client, None
        if client is not None:
            await close_session(client)

    # --- connect --------------------------------------------------------------------

    async def _resolve(self, client: Client) -> list[_Var]:
        """Variables with NodeIds and units, from browse paths and the server's NamespaceArray."""
        ns_array: list[str] = await client.get_namespace_array()
        index = {uri: i for i, uri in enumerate(ns_array)}
        profile = self.settings.profile
        out = [
            _Var(
                spec,
                f"cdu.{spec.key}",
                types.MappingProxyType({"profile": profile.name, "variable": spec.key}),
            )
            for spec in self._specs
        ]
        root_text = self.settings.root or "/".join(str(e) for e in profile.root)
        start, root_path = self._root(root_text, index)
        paths: list[ua.BrowsePath] = []
        owners: list[tuple[int, bool]] = []  # (variable index, is the EngineeringUnits path)
        if root_path:
            try:
                paths.append(self._browse_path(start, root_path, index))
            except KeyError as err:
                raise SourceSetupError(
                    f"{self.name}: namespace {err.args[0]} of root {root_text!r}"
                    f" is not on {self.url}"
                ) from err
            owners.append((-1, False))
        for i, var in enumerate(out):
            configured = self.settings.nodes.get(var.spec.key)
            if configured:
                var.node_id = self._node_id(configured, index)
                var.labels = types.MappingProxyType({**var.labels, "node_id": configured})
                paths.append(self._browse_path(var.node_id, (_ENGINEERING_UNITS,), index))
                owners.append((i, True))
                continue
            try:
                full = root_path + var.spec.path
                paths.append(self._browse_path(start, full, index))
                owners.append((i, False))
                paths.append(self._browse_path(start, (*full, _ENGINEERING_UNITS), index))
                owners.append((i, True))
            except KeyError as err:
                var.fault = f"namespace {err.args[0]} is not on the server"
        results = await self.limits.call(
            "TranslateBrowsePathsToNodeIds",
            self.url,
            paths,
            client.uaclient.translate_browsepaths_to_nodeids,
        )
        eu_nodes: dict[int, ua.NodeId] = {}
        for (i, is_eu), result in zip(owners, results, strict=True):
            good = result.StatusCode.is_good() and bool(result.Targets)
            if i < 0:
                if not good:
                    raise SourceSetupError(
                        f"{self.name}: root {root_text!r} not found on {self.url}"
                        f" ({result.StatusCode.name})"
                    )
            elif is_eu:
                if good:
                    eu_nodes[i] = _plain(result.Targets[0].TargetId)
            elif good:
                node_id = _plain(result.Targets[0].TargetId)
                out[i].node_id = node_id
                out[i].labels = types.MappingProxyType(
                    {**out[i].labels, "node_id": node_id.to_string()}
                )
            else:
                out[i].fault = (
                    f"browse path {'/'.join(str(e) for e in root_path + out[i].spec.path)}"
                    f" not found ({result.StatusCode.name})"
                )
                out[i].missing = True
        if not any(v.node_id is not None for v in out):
            faults = "; ".join(v.fault for v in out if v.fault)
            raise SourceSetupError(f"{self.name}: no variable found on {self.url}: {faults}")
        await self._read_units(client, out, eu_nodes)
        return out

    def _root(
        self, text: str, index: Mapping[str, int]
    ) -> tuple[ua.NodeId, tuple[PathElement, ...]]:
        """Starting node and remaining path for a root given as NodeId or browse path."""
        if _looks_like_node_id(text):
            return self._node_id(text, index), ()
        try:
            path = parse_path(text)
        except ValueError as err:
            raise SourceSetupError(f"{self.name}: root {text!r}: {err}") from err
        return ua.NodeId(ua.Int32(ObjectIds.ObjectsFolder)), path

    def _node_id(self, text: str, index: Mapping[str, int]) -> ua.NodeId:
        """A NodeId from "ns=2;s=X" or "nsu=URI;s=X" (URI looked up on this server)."""
        if text.startswith("nsu="):
            uri, _, rest = text[4:].partition(";")
            if uri not in index:
                raise SourceSetupError(
                    f"{self.name}: namespace {uri!r} of {text!r} is not on the server"
                )
            text = f"ns={index[uri]};{rest}"
        try:
            return ua.NodeId.from_string(text)
        except (ValueError, UaError) as err:
            raise SourceSetupError(f"{self.name}: {text!r} is not a NodeId: {err}") from err

    def _browse_path(
        self, start: ua.NodeId, path: tuple[PathElement, ...], index: Mapping[str, int]
    ) -> ua.BrowsePath:
        """A BrowsePath; KeyError naming the namespace URI when the server lacks it."""
        text = []
        for e in path:
            if e.namespace.isdigit():
                ns = int(e.namespace)
            else:
                uri = self._aliases.get(e.namespace)
                if uri is None:
                    raise SourceSetupError(
                        f"{self.name}: namespace alias {e.namespace!r} is not declared"
                    )
                if uri not in index:
                    raise KeyError(uri)
                ns = index[uri]
            # "/" follows hierarchical references forward, subtypes included (Part 4 A.2).
            text.append(f"/{ns}:{_escape(e.name)}")
        relative = ua.RelativePath.from_string("".join(text))
        return ua.BrowsePath(StartingNode=start, RelativePath=relative)

    async def _read_units(
        self, client: Client, out: list[_Var], eu_nodes: Mapping[int, ua.NodeId]
    ) -> None:
        """Each variable's unit: the server's EngineeringUnits if stated, else the profile's."""
        for var in out:
            var.unit = var.spec.unit
        physical = {i: n for i, n in eu_nodes.items() if _wants_units(out[i].spec)}
        stated: set[int] = set()
        if physical:
            values = await self._read_nodes(client, list(physical.values()))
            for i, dv in zip(physical, values, strict=True):
                eu = dv.Value.Value if dv.Value is not None else None
                if (dv.StatusCode and not dv.StatusCode.is_good()) or not isinstance(
                    eu, ua.EUInformation
                ):
                    continue
                stated.add(i)
                unit = UNITS_BY_UNECE.get(eu.UnitId)
                var = out[i]
                shown = eu.DisplayName.Text if eu.DisplayName else ""
                if unit is None:
                    var.fault = f"unsupported engineering unit {shown!r} (UnitId {eu.UnitId})"
                elif not unit_fits(var.spec.kind, unit):
                    var.fault = f"engineering unit {shown!r} does not fit {var.spec.kind.value}"
                else:
                    var.unit = unit
        for i, var in enumerate(out):
            key = var.spec.key
            if (
                _wants_units(var.spec)
                and var.node_id is not None
                and i not in stated
                and key not in self._logged_default_units
            ):
                log.info(
                    "%s: %s states no EngineeringUnits for %s; using the profile's unit %s",
                    self.name,
                    self.url,
                    key,
                    var.spec.unit.name,
                )
                self._logged_default_units.add(key)

    async def _read_nodes(self, client: Client, nodes: list[ua.NodeId]) -> list[ua.DataValue]:
        """The Value of each node, in as few Reads as the server's MaxNodesPerRead allows."""

        async def send(chunk: list[ua.NodeId]) -> list[ua.DataValue]:
            return await client.uaclient.read(_read_parameters(chunk))

        return await self.limits.call("Read", self.url, nodes, send)

    async def _subscribe(self, client: Client) -> None:
        """One data-change subscription for all variables, seeded by one batched Read."""
        s = self.settings
        interval_ms = s.sampling_interval_s * 1000.0
        keepalive = max(1, math.ceil(s.keepalive_s / s.sampling_interval_s))
        lifetime = max(
            3 * keepalive, math.ceil(_MIN_SUBSCRIPTION_LIFETIME_S / s.sampling_interval_s)
        )
        params = ua.CreateSubscriptionParameters(
            RequestedPublishingInterval=interval_ms,
            RequestedLifetimeCount=lifetime,
            RequestedMaxKeepAliveCount=keepalive,
            MaxNotificationsPerPublish=0,
            PublishingEnabled=True,
            Priority=0,
        )
        session = client.uaclient.session
        try:
            created = await session.create_subscription(params, self._on_publish)
        except UaStatusCodeError as err:
            if err.code not in _SUBSCRIPTIONS_REFUSED:
                raise
            if not self._refused_logged:
                log.warning(
                    "%s: %s refused subscriptions (%s); polling with one Read instead",
                    self.name,
                    self.url,
                    status_name(err.code),
                )
                self._refused_logged = True
            self._polling = True
            return
        items = [
            (handle, v)
            for handle, v in enumerate(self._vars)
            if v.node_id is not None and not v.fault
        ]
        if not self._fits_keepalive(created, interval_ms, keepalive):
            await self._drop_subscription(client, created.SubscriptionId)
            return
        await self._poll(client, self._read_vars)  # seed: the first read has every value
        self._heard = time.monotonic()

        async def send(
            chunk: list[ua.MonitoredItemCreateRequest],
        ) -> list[ua.MonitoredItemCreateResult]:
            return await session.create_monitored_items(
                ua.CreateMonitoredItemsParameters(
                    SubscriptionId=created.SubscriptionId,
                    TimestampsToReturn=ua.TimestampsToReturn.Both,
                    ItemsToCreate=chunk,
                )
            )

        requests = [self._monitored_item(h, v, interval_ms) for h, v in items]
        results = await self.limits.call("CreateMonitoredItems", self.url, requests, send)
        await self._retry_without_filter(items, requests, results, send)
        self._note_items(items, results, interval_ms)
        if items and all(v.polled for _, v in items):
            self._polling = True
            await self._drop_subscription(client, created.SubscriptionId)

    async def _retry_without_filter(
        self,
        items: list[tuple[int, _Var]],
        requests: list[ua.MonitoredItemCreateRequest],
        results: list[ua.MonitoredItemCreateResult],
        send: Callable[
            [list[ua.MonitoredItemCreateRequest]], Awaitable[list[ua.MonitoredItemCreateResult]]
        ],
    ) -> None:
        """Items refused for their filter, asked again with none (the default: any change)."""
        again = [i for i, r in enumerate(results) if r.StatusCode.value in _FILTER_REFUSED]
        if not again:
            return
        for i in again:
            requests[i].RequestedParameters.Filter = None
        retried = await self.limits.call(
            "CreateMonitoredItems", self.url, [requests[i] for i in again], send
        )
        for i, result in zip(again, retried, strict=True):
            results[i] = result
        keys = ", ".join(items[i][1].spec.key for i in again if results[i].StatusCode.is_good())
        if keys:
            self._say(
                f"{self.url} refused the data-change filter for {keys}; subscribed without it"
                " (no deadband: every change is sent)"
            )

    def _say(self, note: str) -> None:
        """A note for probe, logged once per adapter (not at every reconnect)."""
        self._subscription_notes.append(note)
        if note not in self._said:
            self._said.add(note)
            log.warning("%s: %s", self.name, note)

    def _fits_keepalive(
        self, created: ua.CreateSubscriptionResult, interval_ms: float, keepalive: int
    ) -> bool:
        """Follow the server's revised keep-alive; False when it is too slow to tell a silent
        server from steady values within bad_after_s (then polling is the way)."""
        s = self.settings
        revised_ms = created.RevisedPublishingInterval
        if not (math.isfinite(revised_ms) and revised_ms > 0):
            revised_ms = interval_ms
        count = created.RevisedMaxKeepAliveCount or keepalive
        silence_s = revised_ms / 1000.0 * count * _KEEPALIVE_MARGIN
        asked = f"asked {interval_ms:g} ms x {keepalive}"
        revised = f"revised the subscription to {revised_ms:g} ms x {count} keep-alive ({asked})"
        if silence_s > s.bad_after_s:
            self._say(
                f"{self.url} {revised}: steady values would look silent past bad_after_s"
                f" ({s.bad_after_s:g}s); polling with Read instead"
            )
            self._polling = True
            return False
        if silence_s > s.stale_after_s:
            self._stale_after_s = silence_s
            self._say(f"{self.url} {revised}: values turn stale after {silence_s:g}s")
        return True

    def _note_items(
        self,
        items: list[tuple[int, _Var]],
        results: list[ua.MonitoredItemCreateResult],
        interval_ms: float,
    ) -> None:
        """Variables whose monitored item was refused are read instead; slow sampling noted."""
        refused: list[str] = []
        slowest = 0.0
        for (_, var), result in zip(items, results, strict=True):
            if result.StatusCode.is_good():
                slowest = max(slowest, result.RevisedSamplingInterval)
            else:
                var.polled = True
                refused.append(f"{var.spec.key} ({result.StatusCode.name})")
        if refused:
            self._say(
                f"{self.url} refused monitored items for {', '.join(refused)};"
                " reading those with a Read at every read instead"
            )
        if slowest > 2 * interval_ms:
            self._say(
                f"{self.url} samples at {slowest:g} ms, not the {interval_ms:g} ms asked:"
                " values may be that much older than their arrival"
            )

    async def _drop_subscription(self, client: Client, subscription_id: int) -> None:
        try:
            await client.uaclient.session.delete_subscriptions([subscription_id])
        except UaStatusCodeError as err:
            log.debug("%s: deleting subscription: %s", self.name, status_name(err.code))

    def _monitored_item(
        self, handle: int, var: _Var, interval_ms: float
    ) -> ua.MonitoredItemCreateRequest:
        assert var.node_id is not None
        flt = ua.DataChangeFilter(Trigger=ua.DataChangeTrigger.StatusValue)
        if self.settings.deadband > 0 and _wants_units(var.spec):
            flt = ua.DataChangeFilter(
                Trigger=ua.DataChangeTrigger.StatusValue,
                DeadbandType=ua.DeadbandType.Absolute,
                DeadbandValue=self.settings.deadband,
            )
        return ua.MonitoredItemCreateRequest(
            ItemToMonitor=ua.ReadValueId(NodeId=var.node_id, AttributeId=AttributeIds.Value),
            MonitoringMode=ua.MonitoringMode.Reporting,
            RequestedParameters=ua.MonitoringParameters(
                ClientHandle=handle,
                SamplingInterval=interval_ms,
                Filter=flt,
                QueueSize=1,
                DiscardOldest=True,
            ),
        )

    # --- read -----------------------------------------------------------------------

    async def _poll(self, client: Client, wanted: list[_Var]) -> None:
        """These variables read into the cache (one Read, or one per MaxNodesPerRead)."""
        if not wanted:
            return
        nodes = [v.node_id for v in wanted if v.node_id is not None]
        values = await self._read_nodes(client, nodes)
        for var, dv in zip(wanted, values, strict=True):
            self._store(var, dv)

    def _on_publish(self, result: ua.PublishResult) -> None:
        """Publish-loop callback: a data change, a keep-alive or a subscription status change."""
        self._heard = time.monotonic()
        for notification in result.NotificationMessage.NotificationData or ():
            if isinstance(notification, ua.DataChangeNotification):
                self.notifications += len(notification.MonitoredItems)
                for item in notification.MonitoredItems:
                    if 0 <= item.ClientHandle < len(self._vars):
                        self._store(self._vars[item.ClientHandle], item.Value)
            elif isinstance(notification, ua.StatusChangeNotification):
                code = notification.Status.value
                if code & _SEVERITY_MASK:
                    self._lost = f"server ended the subscription ({status_name(code)})"

    @staticmethod
    def _store(var: _Var, dv: ua.DataValue) -> None:
        var.value = dv.Value.Value if dv.Value is not None else None
        var.status = dv.StatusCode.value if dv.StatusCode is not None else _GOOD
        var.source_ts = _epoch(dv.SourceTimestamp)
        var.server_ts = _epoch(dv.ServerTimestamp)

    def _readings(self) -> list[Reading]:
        """The cache as readings, with staleness applied in subscription mode."""
        mono, wall = time.monotonic(), time.time()
        stale = ""
        bad = False
        if not self._polling:
            silence = mono - self._heard
            s = self.settings
            if silence > self._stale_after_s:
                stale = f"stale: nothing from the server for {silence:.1f}s"
            if silence > s.bad_after_s:
                bad = True
                # This read reports BAD; the next raises so the runner rebuilds the session.
                self._lost = f"subscription silent for {silence:.1f}s; rebuilding the session"
        return [self._reading(v, mono, wall, stale, bad) for v in self._vars]

    def _reading(self, var: _Var, mono: float, wall: float, stale: str, bad: bool) -> Reading:
        spec = var.spec
        unit_name = "bool" if spec.transform == "nonzero" else (var.unit or spec.unit).canonical
        value: float | None = None
        reason = ""
        if var.missing:
            quality, reason = Quality.ABSENT, f"not on the server: {var.fault}"
        elif var.fault:
            quality, reason = Quality.BAD, var.fault
        elif var.status & _SEVERITY_MASK == _UNCERTAIN or var.status & _SEVERITY_MASK == 0:
            converted = _convert(var)
            if isinstance(converted, str):
                quality, reason = Quality.BAD, converted
            elif var.status & _SEVERITY_MASK:
                quality, value, reason = Quality.UNCERTAIN, converted, status_name(var.status)
            else:
                quality, value = Quality.GOOD, converted
        else:
            quality, reason = Quality.BAD, status_name(var.status)
        if var.polled:  # read just now: the subscription's silence says nothing about it
            stale, bad = "", False
        if bad and not var.fault:
            quality, value, reason = Quality.BAD, None, stale
        elif stale and quality in (Quality.GOOD, Quality.UNCERTAIN):
            quality, reason = Quality.UNCERTAIN, f"{stale}; {reason}" if reason else stale
        return Reading(
            source=self.name,
            sensor=var.sensor,
            kind=spec.kind,
            value=value,
            unit=unit_name,
            quality=quality,
            mono=mono,
            wall=wall,
            reason=reason,
            device_ts=var.source_ts if var.source_ts is not None else var.server_ts,
            server_ts=var.server_ts,
            labels=var.labels,
        )


def _convert(var: _Var) -> float | str:
    """The value in rackguard's unit, or why it cannot be one."""
    raw = var.value
    if isinstance(raw, bool):
        number = 1.0 if raw else 0.0
    elif isinstance(raw, int | float):
        number = float(raw)
    else:
        return f"not a number: {type(raw).__name__} {raw!r}"[:200]
    if var.spec.transform == "nonzero":
        return 1.0 if number != 0 else 0.0
    unit = var.unit or var.spec.unit
    converted = unit.convert(number)
    low, high = kind_range(var.spec.kind, unit.canonical)
    if not math.isfinite(converted) or not low <= converted <= high:
        return f"out of range: {converted:g} {unit.canonical} (plausible {low:g}..{high:g})"
    return converted


def _wants_units(spec: VariableSpec) -> bool:
    """True for physical quantities, whose EngineeringUnits the server may state."""
    return spec.transform == "value" and spec.unit.canonical not in ("bool", "severity")


def _escape(name: str) -> str:
    """A browse name with the RelativePath syntax characters escaped by '&'."""
    return "".join(f"&{c}" if c in "/.<>:#!&" else c for c in name)


def _looks_like_node_id(text: str) -> bool:
    return text.startswith(("ns=", "nsu=", "i=", "s=", "g=", "b="))


def _read_parameters(nodes: list[ua.NodeId]) -> ua.ReadParameters:
    return ua.ReadParameters(
        MaxAge=0,
        TimestampsToReturn=ua.TimestampsToReturn.Both,
        NodesToRead=[ua.ReadValueId(NodeId=n, AttributeId=AttributeIds.Value) for n in nodes],
    )

"""The [sources.NAME] table for a CDU over OPC-UA (``type = "opcua"``); sources.py builds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from adapters.errors import SourceSetupError

# CDU profiles are TOML data: loading them needs no asyncua.
from adapters.sensors.opcua_profiles import CduProfile, customised, load_profile, parse_path
from daemon.config.secrets import resolve_secret, secret_problem
from daemon.config.sources import SourceTiming, timing_of, timing_problems
from daemon.config.typed_toml import Problems, bounded


@dataclass(frozen=True, slots=True)
class OpcuaSourceConfig:
    """A coolant distribution unit read over OPC-UA."""

    type: Literal["opcua"]
    # opc.tcp://host:port[/path] of the CDU's OPC-UA server.
    url: str
    interval_s: float = bounded(1.0, gt=0, le=3600)
    # Covers a whole reconnect (TCP, secure channel, session, browse, subscribe).
    timeout_s: float = bounded(0.9, gt=0)
    backoff_initial_s: float = bounded(1.0, gt=0)
    backoff_max_s: float = bounded(30.0, gt=0)
    down_after: int = bounded(3, ge=1)
    # subscription: the server pushes changes (normal); poll: one Read per interval.
    # A server that refuses subscriptions is polled either way.
    mode: Literal["subscription", "poll"] = "subscription"
    # Sampling and publishing interval of the subscription.
    sampling_interval_s: float = bounded(1.0, gt=0, le=3600)
    # Absolute deadband (in the server's unit) for analog values; 0 reports every change.
    deadband: float = bounded(0.0, ge=0)
    # The server sends a keep-alive after this much silence (subscription mode).
    keepalive_s: float = bounded(5.0, gt=0)
    # Values turn UNCERTAIN, then BAD, when the server stays silent this long.
    stale_after_s: float = bounded(15.0, gt=0)
    bad_after_s: float = bounded(30.0, gt=0)
    # Timeout of one OPC-UA request (connect steps included).
    request_timeout_s: float = bounded(2.0, gt=0, le=120)
    # Which variables mean what: a profile in profile_dir (NAME.toml, the site's, wins)
    # or one shipped in adapters/sensors/cdu_profiles.
    profile: str = "generic"
    # The site's CDU profiles (*.toml, file stem = profile name).
    profile_dir: Path | None = None
    # The CDU object: a browse path from Objects ("alias:Name/...") or a NodeId
    # ("ns=2;s=CDU", "nsu=urn:vendor;s=CDU"); "" uses the profile's.
    root: str = ""
    # NodeIds for some variables, used instead of their browse paths. A standard
    # variable the profile lacks (e.g. leak for opc40082-tcd) may be added so.
    nodes: dict[str, str] = field(default_factory=dict)
    # Browse paths below the root for some variables, instead of the profile's.
    paths: dict[str, str] = field(default_factory=dict)
    # The unit a variable is in when the server states no EngineeringUnits.
    units: dict[str, str] = field(default_factory=dict)
    # Namespace URIs for the profile's aliases, e.g. { cdu = "urn:vendor:cdu" }.
    namespaces: dict[str, str] = field(default_factory=dict)
    # Profile variables to read; empty reads all.
    variables: list[str] = field(default_factory=list)
    security_policy: Literal["None", "Basic256Sha256"] = "None"
    security_mode: Literal["None", "Sign", "SignAndEncrypt"] = "None"
    certificate_file: Path | None = None
    # The client's private key: a secret, so a bare name is a systemd credential
    # (LoadCredential=), readable by the service's DynamicUser.
    private_key_file: Path | None = None
    private_key_password_file: Path | None = None
    # The server certificate(s) rackguard trusts (PEM bundle or DER).
    server_certificate_file: Path | None = None
    username: str = ""
    password_file: Path | None = None

    @property
    def timing(self) -> SourceTiming:
        """The runner's view of this source."""
        return timing_of(self)

    def validate(self) -> Problems:
        """Cross-field checks: timing, staleness, profile, security and secret files."""
        yield from timing_problems(self)
        parts = urlsplit(self.url)
        if parts.scheme != "opc.tcp" or not parts.hostname:
            yield "url", f"must be an opc.tcp://host:port URL, got {self.url!r}"
        if self.mode == "subscription" and self.stale_after_s <= self.keepalive_s:
            yield (
                "stale_after_s",
                f"must be more than keepalive_s ({self.keepalive_s}), else steady values"
                f" turn stale between keep-alives; got {self.stale_after_s}",
            )
        if self.bad_after_s <= self.stale_after_s:
            yield (
                "bad_after_s",
                f"must be more than stale_after_s ({self.stale_after_s}), got {self.bad_after_s}",
            )
        yield from self._check_profile()
        yield from self._check_security()

    def effective_profile(self) -> CduProfile:
        """The profile with this source's paths, units and added variables applied.

        SourceSetupError names the file and key (a broken profile) or the config key.
        """
        profile = load_profile(self.profile, self.profile_dir)
        try:
            return customised(profile, nodes=self.nodes, paths=self.paths, units=self.units)
        except ValueError as err:
            raise SourceSetupError(str(err)) from err

    def _check_profile(self) -> Problems:
        try:
            load_profile(self.profile, self.profile_dir)
        except SourceSetupError as err:
            key = "profile_dir" if self.profile_dir and str(self.profile_dir) in str(err) else ""
            yield key or "profile", str(err)
            return
        try:
            profile = self.effective_profile()
        except SourceSetupError as err:
            key, _, message = str(err).partition(": ")
            yield key, message
            return
        known = {v.key for v in profile.variables}
        for key in self.variables:
            if key not in known:
                yield (
                    "variables",
                    f"{key!r} is not a variable of profile {self.profile!r}"
                    f" ({', '.join(sorted(known))})",
                )
        if self.root and not self.root.startswith(("ns=", "nsu=", "i=", "s=")):
            try:
                for element in parse_path(self.root):
                    aliases = {**profile.namespaces, **self.namespaces}
                    if element.namespace not in aliases and not element.namespace.isdigit():
                        yield "root", f"namespace alias {element.namespace!r} is not declared"
            except ValueError as err:
                yield "root", str(err)
        aliases = {**profile.namespaces, **self.namespaces}
        for key, text in self.paths.items():
            for element in parse_path(text):  # customised() checked the syntax
                if element.namespace not in aliases and not element.namespace.isdigit():
                    yield (
                        f"paths.{key}",
                        f"namespace alias {element.namespace!r} is not declared"
                        " (add it to namespaces)",
                    )

    def _check_security(self) -> Problems:
        secure = self.security_policy != "None"
        if secure != (self.security_mode != "None"):
            yield (
                "security_mode",
                f"must be Sign or SignAndEncrypt with policy {self.security_policy}, and None"
                f" without one; got {self.security_mode}",
            )
        if secure:
            for key in ("certificate_file", "private_key_file", "server_certificate_file"):
                path = getattr(self, key)
                if path is None:
                    yield key, f"is required with security_policy {self.security_policy}"
                    continue
                # The private key is a secret (a bare name is a systemd credential);
                # the certificates are public and may be readable by anyone.
                private = key == "private_key_file"
                path = resolve_secret(path) if private else path
                problem = secret_problem(path, private=private)
                if problem:
                    yield key, problem
        if self.username and self.password_file is None:
            yield "password_file", "is required with username"
        if self.password_file is not None and not self.username:
            yield "username", "is required with password_file"
        for key in ("password_file", "private_key_password_file"):
            path = getattr(self, key)
            if path is not None:
                problem = secret_problem(resolve_secret(path))
                if problem:
                    yield key, problem

"""Opening and closing one OPC-UA session with asyncua, and turning its failures into our errors.

We drive asyncua's low-level steps (socket, hello, secure channel, create and activate
session) rather than ``Client.connect()``, so that no asyncua supervisor, watchdog or
reconnect task runs behind our back: the adapter decides when a session is dead and
the daemon's runner decides when to build a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from asyncua import ua
from asyncua.client.client import Client
from asyncua.crypto import security_policies, uacrypto
from asyncua.ua.status_codes import StatusCodes
from asyncua.ua.uaerrors import UaError, UaStatusCodeError
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtensionOID

from adapters.errors import SourceAuthError, SourceSetupError, SourceUnavailable
from adapters.timeouts import time_limit

log = logging.getLogger(__name__)

SecurityPolicy = Literal["None", "Basic256Sha256"]
SecurityMode = Literal["None", "Sign", "SignAndEncrypt"]

_CLOSE_GRACE_S = 0.5  # a polite CloseSession, then the socket is dropped

# ActivateSession results that mean "these credentials are refused".
_AUTH_CODES = frozenset(
    {
        StatusCodes.BadUserAccessDenied,
        StatusCodes.BadIdentityTokenInvalid,
        StatusCodes.BadIdentityTokenRejected,
        StatusCodes.BadUserSignatureInvalid,
    }
)
# Results that mean the two sides do not trust each other's certificates.
_TRUST_CODES = frozenset(
    {
        StatusCodes.BadCertificateUntrusted,
        StatusCodes.BadCertificateInvalid,
        StatusCodes.BadCertificateUriInvalid,
        StatusCodes.BadCertificateTimeInvalid,
        StatusCodes.BadCertificateRevoked,
        StatusCodes.BadCertificateUseNotAllowed,
        StatusCodes.BadSecurityChecksFailed,
        StatusCodes.BadSecurityPolicyRejected,
        StatusCodes.BadNoValidCertificates,
    }
)


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """Message security and the certificates it needs (files, never inline)."""

    policy: SecurityPolicy = "None"
    mode: SecurityMode = "None"
    certificate: Path | None = None  # client certificate (PEM or DER)
    private_key: Path | None = None  # its key (PEM or DER)
    private_key_password: Callable[[], str] | None = None
    server_certificate: Path | None = None  # the server certificate(s) we trust (PEM bundle or DER)


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Where and how to open a session."""

    url: str
    request_timeout_s: float = 2.0
    session_timeout_s: float = 120.0
    channel_lifetime_s: float = 3600.0  # the secure channel is renewed at 75 % of it
    security: SecuritySettings = SecuritySettings()
    username: str | None = None
    password: Callable[[], str] | None = None  # read at every connect, so rotation needs no restart


def status_name(code: int) -> str:
    """The symbolic name of an OPC-UA status code, e.g. BadSensorFailure."""
    return ua.StatusCode(ua.UInt32(code)).name


def fingerprint(der: bytes) -> str:
    """SHA-256 fingerprint as colon-separated hex, as openssl prints it."""
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def load_trusted_certificates(path: Path) -> list[bytes]:
    """Every certificate in a PEM bundle or one DER file, as DER; SourceSetupError if unusable."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SourceSetupError(
            f"server_certificate_file {str(path)!r} cannot be read: {err.strerror or err}"
        ) from err
    try:
        if b"-----BEGIN" in data:
            certs = x509.load_pem_x509_certificates(data)
        else:
            certs = [x509.load_der_x509_certificate(data)]
    except ValueError as err:
        raise SourceSetupError(
            f"server_certificate_file {str(path)!r} holds no readable certificate: {err}"
        ) from err
    return [c.public_bytes(serialization.Encoding.DER) for c in certs]


def _by_content(path: Path, password: str | None = None) -> uacrypto.CertProperties:
    """A certificate or key file as PEM or DER by what it holds, not by its name.

    asyncua goes by the extension (".pem" or DER), so a PEM key named "cdu-client.key"
    (or a systemd credential, which has whatever name the unit gives it) would fail.
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError:
        return uacrypto.CertProperties(str(path))  # asyncua's own error names the file
    kind = "pem" if b"-----BEGIN" in head else "der"
    return uacrypto.CertProperties(str(path), extension=kind, password=password)


def _application_uri(cert_path: Path) -> str | None:
    """The URI in the certificate's subjectAltName: OPC-UA requires it to be our ApplicationUri."""
    try:
        data = cert_path.read_bytes()
        cert = (
            x509.load_pem_x509_certificate(data)
            if b"-----BEGIN" in data
            else x509.load_der_x509_certificate(data)
        )
        san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    except OSError as err:
        raise SourceSetupError(
            f"client certificate {str(cert_path)!r} cannot be read: {err.strerror or err}"
        ) from err
    except ValueError as err:
        raise SourceSetupError(
            f"client certificate {str(cert_path)!r} is not readable: {err}"
        ) from err
    except x509.ExtensionNotFound:
        return None
    names = san.value
    assert isinstance(names, x509.SubjectAlternativeName)
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else None


async def _pick_endpoint(url: str, sec: SecuritySettings, timeout_s: float) -> bytes:
    """The server certificate of the endpoint matching our policy and mode (via GetEndpoints)."""
    probe = Client(url, timeout=timeout_s)
    try:
        endpoints = await probe.connect_and_get_server_endpoints()
    except (OSError, TimeoutError, UaError) as err:
        raise SourceUnavailable(f"cannot list endpoints of {url}: {_describe(err)}") from err
    policy_uri = getattr(security_policies, f"SecurityPolicy{sec.policy}").URI
    mode = getattr(ua.MessageSecurityMode, sec.mode)
    for ep in endpoints:
        if ep.SecurityPolicyUri == policy_uri and ep.SecurityMode == mode:
            cert: bytes = ep.ServerCertificate or b""
            return cert
    offered = ", ".join(
        sorted(
            {f"{e.SecurityPolicyUri.rsplit('#', 1)[-1]}/{e.SecurityMode.name}" for e in endpoints}
        )
    )
    raise SourceSetupError(
        f"{url} offers no {sec.policy}/{sec.mode} endpoint; it offers: {offered or 'none'}"
    )


def _first_der(chain: bytes) -> bytes:
    """The leaf certificate of a DER chain (servers may send leaf + CAs concatenated)."""
    if not chain:
        return b""
    cert = uacrypto.x509_from_der(chain)  # type: ignore[no-untyped-call]
    return b"" if cert is None else bytes(cert.public_bytes(serialization.Encoding.DER))


async def _configure_security(client: Client, settings: SessionSettings) -> None:
    """Check the server's certificate against our trust file, then set up signing/encryption."""
    sec = settings.security
    if sec.policy == "None":
        return
    assert sec.certificate is not None and sec.private_key is not None  # config validate()
    assert sec.server_certificate is not None
    trusted = load_trusted_certificates(sec.server_certificate)
    presented = _first_der(await _pick_endpoint(settings.url, sec, settings.request_timeout_s))
    if presented not in trusted:
        raise SourceAuthError(
            f"server certificate not trusted: {settings.url} presents SHA-256 "
            f"{fingerprint(presented) if presented else '(none)'}, which is not in "
            f"server_certificate_file {str(sec.server_certificate)!r}; if the server's "
            "certificate was renewed on purpose, add the new one to that file"
        )
    uri = _application_uri(sec.certificate)
    if uri:
        client.application_uri = uri
    key_password = sec.private_key_password() if sec.private_key_password else None
    try:
        await client.set_security(
            getattr(security_policies, f"SecurityPolicy{sec.policy}"),
            certificate=_by_content(sec.certificate),
            private_key=_by_content(sec.private_key, key_password),
            private_key_password=key_password,
            server_certificate=uacrypto.CertProperties(presented, extension="der"),
            mode=getattr(ua.MessageSecurityMode, sec.mode),
        )
    except (OSError, ValueError, TypeError) as err:
        raise SourceSetupError(
            f"client certificate {str(sec.certificate)!r} / key {str(sec.private_key)!r}"
            f" unusable: {err}"
        ) from err


def _describe(err: BaseException) -> str:
    if isinstance(err, UaStatusCodeError):
        return status_name(err.code)
    if isinstance(err, TimeoutError):
        return "no answer (timed out)"
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def translate_error(url: str, step: str, err: BaseException) -> Exception:
    """Our error for a failure of ``step`` (e.g. "activate session") against ``url``."""
    code = err.code if isinstance(err, UaStatusCodeError) else None
    if code in _AUTH_CODES:
        return SourceAuthError(
            f"{url} refused our credentials at {step} ({status_name(code)}):"
            " check username and password_file"
        )
    if code in _TRUST_CODES:
        return SourceAuthError(
            f"{url} rejected the secure channel at {step} ({status_name(code)}): the server"
            " does not trust our client certificate, or the policy/mode is not allowed"
        )
    if isinstance(err, UaError) and "certificate mismatch" in str(err).lower():
        return SourceAuthError(
            f"{url} presented a different certificate at {step} than its endpoint listed"
        )
    return SourceUnavailable(f"{url}: {step} failed: {_describe(err)}")


async def open_session(settings: SessionSettings) -> Client:
    """A connected, activated client; else SourceUnavailable, -AuthError or -SetupError."""
    client = Client(settings.url, timeout=settings.request_timeout_s)
    client.name = client.description = "rackguard"
    client.application_uri = "urn:rackguard:client"
    client.product_uri = "urn:rackguard"
    client.session_timeout = int(settings.session_timeout_s * 1000)
    client.secure_channel_timeout = int(settings.channel_lifetime_s * 1000)
    await _configure_security(client, settings)
    password = settings.password() if settings.password else None
    step = "connect"
    try:
        await client.connect_socket()
        step = "hello"
        await client.send_hello()
        step = "open secure channel"
        await client.open_secure_channel()
        step = "create session"
        await client.create_session()
        step = "activate session"
        await client.activate_session(username=settings.username, password=password)
    except (OSError, TimeoutError, UaError) as err:
        await close_session(client)
        raise translate_error(settings.url, step, err) from err
    except BaseException:
        await close_session(client)
        raise
    return client


async def renew_channel_if_due(client: Client, opened_at: float, now: float) -> bool:
    """Renew the secure channel past 75 % of its lifetime (OPC-UA Part 4); True when renewed."""
    if now - opened_at < client.secure_channel_timeout * 0.75 / 1000:
        return False
    await client.open_secure_channel(renew=True)
    client.uaclient.revolve_security_token()
    return True


async def close_session(client: Client) -> None:
    """CloseSession politely if the server answers within a moment, then drop the socket."""
    try:
        async with time_limit(_CLOSE_GRACE_S):
            await client.close_session()
            with contextlib.suppress(OSError, UaError):
                await client.close_secure_channel()
    except (OSError, TimeoutError, UaError) as err:
        log.debug("closing OPC-UA session to %s: %s", client.server_url.geturl(), _describe(err))
    finally:
        client.disconnect_socket()

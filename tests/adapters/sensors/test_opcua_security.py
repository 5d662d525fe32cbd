"""OPC-UA security against the fake CDU server: Basic256Sha256, certificates, passwords.

Certificates are made here with the cryptography package (self-signed, as most CDU
controllers ship them), so nothing depends on files outside the test.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from adapters.errors import SourceAuthError
from adapters.sensors.opcua import OpcuaAdapter, OpcuaSettings
from adapters.sensors.opcua_profiles import load_profile
from adapters.sensors.opcua_session import SecuritySettings, SessionSettings
from daemon.config.opcua import OpcuaSourceConfig
from daemon.config.typed_toml import load_typed
from daemon.service.sources import build_opcua_adapter
from fakes.cdu_server import FakeCduServer
from fakes.sim.thermal import CduSnapshot
from policies.model import Quality
from tests.support.secrets import write_secret

SNAPSHOT = CduSnapshot(29.5, 36.0, 41.0, 118.0, 70.0, True, False, False)
USER, PASSWORD = "rackguard", "correct horse battery staple"


@dataclass(frozen=True)
class Identity:
    """A certificate and its key as files."""

    cert: Path
    key: Path


def make_identity(folder: Path, name: str, uri: str) -> Identity:
    """A self-signed OPC-UA application certificate (RSA 2048, SHA-256) with its URI."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(uri), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,
                key_encipherment=True,
                data_encipherment=True,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    ident = Identity(folder / f"{name}.pem", folder / f"{name}.key.pem")
    ident.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_secret(
        ident.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return ident


@dataclass(frozen=True)
class Pki:
    server: Identity
    client: Identity
    stranger: Identity  # trusted by nobody


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    return Pki(
        server=make_identity(folder, "cdu-server", "urn:rackguard:fake-cdu"),
        client=make_identity(folder, "rackguard-client", "urn:rackguard:test-client"),
        stranger=make_identity(folder, "stranger", "urn:example:stranger"),
    )


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[FakeCduServer]:
    """Secure endpoints only; one user; only our client certificate is trusted."""
    srv = FakeCduServer(
        model="generic",
        security=("Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt"),
        certificate=pki.server.cert,
        private_key=pki.server.key,
        users={USER: PASSWORD},
        trusted_clients=[pki.client.cert],
    )
    await srv.start()
    await srv.publish(SNAPSHOT)
    yield srv
    await srv.stop()


def secure_settings(
    srv: FakeCduServer,
    pki: Pki,
    *,
    mode: str = "SignAndEncrypt",
    password: str = PASSWORD,
    client: Identity | None = None,
    trust: Path | None = None,
) -> OpcuaSettings:
    ident = client or pki.client
    secret: Callable[[], str] = lambda: password  # noqa: E731
    return OpcuaSettings(
        session=SessionSettings(
            srv.url,
            request_timeout_s=3.0,
            security=SecuritySettings(
                policy="Basic256Sha256",
                mode="Sign" if mode == "Sign" else "SignAndEncrypt",
                certificate=ident.cert,
                private_key=ident.key,
                server_certificate=trust or pki.server.cert,
            ),
            username=USER,
            password=secret,
        ),
        profile=load_profile("generic"),
        sampling_interval_s=0.1,
        keepalive_s=0.5,
        stale_after_s=2.0,
        bad_after_s=4.0,
    )


@pytest.mark.parametrize("mode", ["Sign", "SignAndEncrypt"])
async def test_secure_channel_with_certificates_and_password_reads_values(
    server: FakeCduServer, pki: Pki, mode: str
) -> None:
    a = OpcuaAdapter("cdu", secure_settings(server, pki, mode=mode))
    try:
        await a.connect()
        got = {r.sensor: r for r in await a.read()}
        assert got["cdu.flow"].quality is Quality.GOOD
        assert got["cdu.flow"].value == pytest.approx(SNAPSHOT.flow_lpm)
        assert got["cdu.supply_temperature"].value == pytest.approx(SNAPSHOT.supply_c)
    finally:
        await a.close()


async def test_wrong_password_is_a_clear_auth_error_every_time(
    server: FakeCduServer, pki: Pki
) -> None:
    a = OpcuaAdapter("cdu", secure_settings(server, pki, password="wrong"))
    for _ in range(2):  # no hidden retry: each connect fails at once, the same way
        began = time.monotonic()
        with pytest.raises(SourceAuthError, match=r"refused our credentials.*BadUserAccessDenied"):
            await a.connect()
        assert time.monotonic() - began < 2.5


async def test_untrusted_server_certificate_is_a_clear_auth_error(
    server: FakeCduServer, pki: Pki
) -> None:
    a = OpcuaAdapter("cdu", secure_settings(server, pki, trust=pki.stranger.cert))
    with pytest.raises(SourceAuthError, match="server certificate not trusted") as info:
        await a.connect()
    assert str(pki.stranger.cert) in str(info.value)


async def test_client_certificate_the_server_does_not_trust_is_an_auth_error(
    server: FakeCduServer, pki: Pki
) -> None:
    a = OpcuaAdapter("cdu", secure_settings(server, pki, client=pki.stranger))
    with pytest.raises(SourceAuthError, match="BadCertificateUntrusted"):
        await a.connect()


async def test_config_reads_password_from_its_file(
    server: FakeCduServer, pki: Pki, tmp_path: Path
) -> None:
    password_file = tmp_path / "cdu.password"
    write_secret(password_file, PASSWORD + "\n")
    cfg = load_typed(
        OpcuaSourceConfig,
        {
            "type": "opcua",
            "url": server.url,
            "security_policy": "Basic256Sha256",
            "security_mode": "SignAndEncrypt",
            "certificate_file": str(pki.client.cert),
            "private_key_file": str(pki.client.key),
            "server_certificate_file": str(pki.server.cert),
            "username": USER,
            "password_file": str(password_file),
        },
    )
    a = build_opcua_adapter("cdu", cfg)
    a.settings = replace(a.settings, sampling_interval_s=0.1)
    try:
        await a.connect()
        assert all(r.quality is Quality.GOOD for r in await a.read())
    finally:
        await a.close()
    # A rotated (here: wrong) password is picked up at the next connect.
    write_secret(password_file, "rotated-wrong\n")
    with pytest.raises(SourceAuthError):
        await a.connect()


async def test_a_pem_key_and_certificate_with_any_file_name_are_used(
    server: FakeCduServer, pki: Pki, tmp_path: Path
) -> None:
    """A PEM key named like a systemd credential ("cdu-client.key"), not "*.pem"."""
    key = tmp_path / "cdu-client.key"
    key.write_bytes(pki.client.key.read_bytes())
    cert = tmp_path / "cdu-client.crt"
    cert.write_bytes(pki.client.cert.read_bytes())
    a = OpcuaAdapter("cdu", secure_settings(server, pki, client=Identity(cert, key)))
    try:
        await a.connect()
        got = {r.sensor: r for r in await a.read()}
        assert got["cdu.flow"].quality is Quality.GOOD
    finally:
        await a.close()

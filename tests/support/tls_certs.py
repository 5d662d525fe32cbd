"""A throwaway CA with server and client certificates, made in the test (``cryptography``)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.secrets import write_secret


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key (0600), as PEM files."""

    cert: Path
    key: Path


class Ca:
    """A CA that signs certificates for 127.0.0.1 and for named clients."""

    def __init__(self, folder: Path, name: str = "rackguard-test-ca") -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            self._builder(self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / f"{name}.pem"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, public: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, name: str, *, cn: bool = True) -> Pair:
        """A certificate for ``name``, good as a server on 127.0.0.1 and as a client.

        ``cn=False``: the name as the organisation only, no CommonName (what etcd's
        gateway accepts from a client while etcd's authentication is on).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        oid = NameOID.COMMON_NAME if cn else NameOID.ORGANIZATION_NAME
        subject = x509.Name([x509.NameAttribute(oid, name)])
        cert = (
            self._builder(subject, key.public_key())
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        pair = Pair(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_secret(
            pair.key,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        return pair

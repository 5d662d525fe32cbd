"""The etcd client a config asks for: endpoints, TLS material and credentials, from secret files."""

from __future__ import annotations

import ssl

from daemon.cluster.etcd import EtcdClient
from daemon.config.cluster import ClusterConfig
from daemon.config.secrets import read_secret, resolve_secret


def etcd_client(c: ClusterConfig) -> EtcdClient:
    """A client for ``[cluster] etcd`` (check-config has vetted the files)."""
    tls = None
    if any(u.startswith("https://") for u in c.etcd):
        ca = resolve_secret(c.etcd_ca_file) if c.etcd_ca_file is not None else None
        tls = ssl.create_default_context(cafile=str(ca) if ca else None)
        if c.etcd_cert_file is not None and c.etcd_key_file is not None:
            tls.load_cert_chain(resolve_secret(c.etcd_cert_file), resolve_secret(c.etcd_key_file))
    password = ""
    if c.etcd_password_file is not None:
        password = read_secret(c.etcd_password_file).decode()
    return EtcdClient(
        c.etcd, timeout_s=c.claim_timeout_s, tls=tls, user=c.etcd_user, password=password
    )

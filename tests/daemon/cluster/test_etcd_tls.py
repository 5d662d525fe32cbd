"""etcd as production runs it: a real member with TLS, --client-cert-auth and authentication on.

The certificates are made here by a throwaway CA; the member's users and the
minimal role (read and write under the prefix only, as docs/fleet.md says) are
set up through the same gateway the agent speaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemon.cluster.agent import EtcdAgent
from daemon.cluster.claims import Budgets
from daemon.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, b64, prefix_end
from daemon.cluster.etcd_connect import etcd_client
from daemon.config import parse_config
from daemon.config.cluster import ClusterConfig
from fakes.etcd_server import EtcdServer, etcd_available
from tests.daemon.cluster.test_fleet import fleet_agent
from tests.support.secrets import write_secret
from tests.support.tls_certs import Ca, Pair
from tests.support.wait import wait_until

PREFIX = "/rg/"
PASSWORD = "rackguard-etcd-password"


@dataclass
class Secured:
    """The member, its CA and a client certificate (no CN) for the agents."""

    server: EtcdServer
    ca: Ca
    client: Pair
    folder: Path


def context(ca: Ca, pair: Pair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.load_cert_chain(pair.cert, pair.key)
    return ctx


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    why = etcd_available()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("etcd-tls")
    ca = Ca(folder)
    server_pair, root = ca.issue("etcd"), ca.issue("root")
    args = (
        f"--cert-file={server_pair.cert}",
        f"--key-file={server_pair.key}",
        f"--trusted-ca-file={ca.cert}",
        "--client-cert-auth",
    )
    server = EtcdServer(tls_args=args, health_tls=context(ca, root))
    server.start()
    yield Secured(server, ca, ca.issue("rackguard", cn=False), folder)
    server.close()


@pytest.fixture(scope="module")
def with_auth(secured: Secured) -> Secured:
    """Users root and rackguard; rackguard's role: readwrite on the prefix only; auth on."""
    asyncio.run(enable_auth(secured))
    return secured


async def enable_auth(s: Secured) -> None:
    """What docs/fleet.md has the operator do with etcdctl, through the gateway."""
    admin = EtcdClient([s.server.url], timeout_s=5.0, tls=context(s.ca, s.ca.issue("admin")))
    perm = {"permType": "READWRITE", "key": b64(PREFIX), "range_end": prefix_end(PREFIX)}
    for path, body in (
        ("/v3/auth/user/add", {"name": "root", "password": "root-password"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/role/add", {"name": "rackguard"}),
        ("/v3/auth/role/grant", {"name": "rackguard", "perm": perm}),
        ("/v3/auth/user/add", {"name": "rackguard", "password": PASSWORD}),
        ("/v3/auth/user/grant", {"user": "rackguard", "role": "rackguard"}),
        ("/v3/auth/enable", {}),
    ):
        await admin.call(path, body)
    await admin.close()


def cluster_config(s: Secured, password: str = PASSWORD, cert: Pair | None = None) -> ClusterConfig:
    """The [cluster] table an operator writes, through the config loader."""
    pw = write_secret(s.folder / "etcd.password", password + "\n")
    pair = cert or s.client
    return parse_config(f"""
[node]
name = "a1"
[sources.gpus]
type = "nvml"
[cluster]
etcd = ["{s.server.url}"]
etcd_prefix = "{PREFIX}"
etcd_ca_file = "{s.ca.cert}"
etcd_cert_file = "{pair.cert}"
etcd_key_file = "{pair.key}"
etcd_user = "rackguard"
etcd_password_file = "{pw}"
""").cluster


async def test_an_agent_claims_over_tls_as_its_user_and_its_role_reaches_only_the_prefix(
    with_auth: Secured,
) -> None:
    client = etcd_client(cluster_config(with_auth))
    agent = EtcdAgent(client, "a1", prefix=PREFIX, lease_ttl_s=5)
    agent.claims.lease = await client.grant(30)
    assert (await agent.claims.claim_drain("a", True, Budgets(1, 1, 50, 600.0, 1, 2.0))).granted
    kvs, _ = await client.get_prefix(PREFIX + "drain/cluster/")
    assert [kv.value for kv in kvs] == [b"a1"]
    with pytest.raises(EtcdError, match="permission denied"):
        await client.put("/elsewhere", "x")  # the minimal role: nothing outside the prefix
    # A restart forgets every token (so does etcd's auth-token-ttl): the client signs in again.
    with_auth.server.stop()
    with_auth.server.start()
    with contextlib.suppress(EtcdUnavailable):  # the pooled connection died with the server
        await client.get_prefix(PREFIX)
    kvs, _ = await client.get_prefix(PREFIX + "drain/")
    assert len(kvs) == 1
    await client.revoke(agent.claims.lease)
    await client.close()


async def test_the_fleet_runs_on_a_tls_etcd_with_auth_watch_included(with_auth: Secured) -> None:
    config = cluster_config(with_auth)
    url = with_auth.server.url
    async with fleet_agent(url, "a1", "a", PREFIX, 5, etcd_client(config)) as fleet:
        agent = fleet.etcd
        assert agent is not None and agent.up
        writer = etcd_client(config)
        await writer.put(PREFIX + "breaker", b'{"trips": 9, "by": "b1"}')
        await wait_until(lambda: agent.get("breaker") is not None, timeout=5, what="watched")
        await writer.delete(PREFIX + "breaker")
        await writer.close()


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("password", "authentication failed, invalid user ID or password (user 'rackguard')"),
        ("no certificate", "bad certificate"),
        ("a CN", "certificate without a CN and authenticate with etcd_user"),
    ],
)
async def test_wrong_credentials_are_refused_with_a_reason(
    with_auth: Secured, case: str, words: str
) -> None:
    if case == "password":
        client = etcd_client(cluster_config(with_auth, password="wrong"))
    elif case == "a CN":
        client = etcd_client(cluster_config(with_auth, cert=with_auth.ca.issue("rackguard-cn")))
    else:
        tls = ssl.create_default_context(cafile=str(with_auth.ca.cert))
        client = EtcdClient([with_auth.server.url], tls=tls, user="rackguard", password=PASSWORD)
    with pytest.raises(EtcdError) as err:
        await client.grant(5)
    assert words in str(err.value)
    assert isinstance(err.value, EtcdUnavailable) == (case == "no certificate")
    await client.close()

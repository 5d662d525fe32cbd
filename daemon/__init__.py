"""The rackguard daemon.

Imports inside daemon/ go one way, down these layers (tests/daemon/test_layers.py
walks them): a module may import its own layer and the ones below, never above.

0. poller, loops, clock, version, deploy: no daemon imports
1. config: the TOML, checked
2. delivery: the outbox and what reads or writes through it
3. cluster: the scheduler view, etcd, the rack leader, the fleet
4. service, replay: the parts the running daemon is assembled from
5. http: the API, its bodies, the read-only view it gets of the service
6. app, status, snmp_probe, powercap_helper: the Daemon, which wires everything
   together; probes; the privileged power-limit helper (a process of its own)
7. cli
"""

LAYERS: dict[str, int] = {
    "poller": 0,
    "loops": 0,
    "clock": 0,
    "version": 0,
    "deploy": 0,
    "config": 1,
    "delivery": 2,
    "cluster": 3,
    "service": 4,
    "replay": 4,
    "http": 5,
    "app": 6,
    "status": 6,
    "snmp_probe": 6,
    "powercap_helper": 6,
    "cli": 7,
}

"""One fleet, not N agents: the cluster view, etcd claims and the rack leader."""

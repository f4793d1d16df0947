"""Machines analysed once per kind: positional descriptions, routes inside a machine that are
provably the graph's, and the router's shortcuts (inside a machine, through the fabric's
tables) routing exactly as a router without them."""
import random

import networkx as nx
import pytest

import topologies
from topologies.hosts import LocalRoutes, machine_signature
from topologies.routing import Router

CLUSTERS = [f"cluster:{p}x3,fabric={f}" for p in topologies.PRESETS
            for f in ("leaf_spine", "rail", "fat_tree")
            if p not in ("pcie_box", "p2_16xlarge") or f == "leaf_spine"]


def _host(G, h):
    return [n for n in G if G.nodes[n].get("host") == h]


def test_copies_share_a_description_and_a_changed_link_breaks_it():
    G = topologies.from_spec("cluster:dgx_h100x3")
    sigs = [machine_signature(G, _host(G, h), shift={"rank": 8 * h}) for h in range(3)]
    assert sigs[0] == sigs[1] == sigs[2]
    G.edges["n1.gpu3", "n1.pcie1"]["latency"] *= 2
    assert machine_signature(G, _host(G, 1), shift={"rank": 8}) != sigs[0]
    assert machine_signature(G, _host(G, 2), shift={"rank": 16}) == sigs[0]


@pytest.mark.parametrize("spec", CLUSTERS[::3] + ["dgx1_v100", "p4d"])
def test_local_routes_are_the_routers_where_proved(spec):
    G = topologies.from_spec(spec)
    router = Router(G)
    hosts = sorted({d["host"] for _, d in G.nodes(data=True) if "host" in d}) or [None]
    for h in hosts[:2]:
        nodes = _host(G, h) if h is not None else list(G)
        local = LocalRoutes(G, nodes)
        for i in range(len(nodes)):
            for j in range(len(nodes)):
                if i == j or not local.exact(i, j):
                    continue
                assert local.latency(i, j) == router.latency(nodes[i], nodes[j])
                seq = local.unique_path(i, j)
                if seq is not None:
                    assert tuple(nodes[k] for k in seq) == router.path(nodes[i], nodes[j], 7)


def test_a_machine_whose_shortest_route_leaves_it_is_not_proved():
    # Two GPUs joined inside by a slow link and outside, through a switch, by fast ones.
    G = nx.Graph(name="t")
    for k in range(2):
        G.add_node(f"g{k}", kind="gpu", rank=k, host=0)
        G.add_edge(f"g{k}", "sw", bandwidth=1e9, latency=1e-6)
    G.add_node("sw", kind="switch")
    G.add_edge("g0", "g1", bandwidth=1e9, latency=5e-6)
    local = LocalRoutes(G, ["g0", "g1"])
    assert not local.exact(0, 1) and local.unique_path(0, 1) is None
    assert Router(G).path("g0", "g1") == ("g0", "sw", "g1")
    G.edges["g0", "g1"]["latency"] = 1e-6
    assert LocalRoutes(G, ["g0", "g1"]).exact(0, 1)


def _pairs(G, seed, n=400):
    rng = random.Random(seed)
    nodes = sorted(G.nodes, key=str)
    hosts: dict = {}
    for x, d in G.nodes(data=True):
        hosts.setdefault(d.get("host"), []).append(x)
    inside = [(rng.choice(v), rng.choice(v)) for k, v in sorted(hosts.items(), key=str)
              if k is not None for _ in range(20)]
    return inside + [(rng.choice(nodes), rng.choice(nodes)) for _ in range(n)]


@pytest.mark.parametrize("spec", CLUSTERS)
def test_router_shortcuts_route_as_plain_searches(spec, monkeypatch):
    G = topologies.from_spec(spec)
    pairs = _pairs(G, seed=len(spec))
    fast = Router(G)
    for a, b in pairs:                     # both directions: the second reverses the first's DAG
        fast.path(a, b, 3)
        fast.path(b, a, 3)
    plain = _plain(Router(G), monkeypatch)
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            fresh = _plain(Router(G), monkeypatch)     # one search, nothing shared
            assert fast.path(x, y, 3) == plain.path(x, y, 3) == fresh.path(x, y, 3), (x, y)
            assert fast.equal_cost_paths(x, y) == plain.equal_cost_paths(x, y)


def _plain(router, monkeypatch):
    """A router that searches every pair: no shortcut inside machines or through the
    fabric's tables, no distance maps."""
    monkeypatch.setattr(router, "_in_host", lambda i, j, salt: (None, False))
    monkeypatch.setattr(router, "_fabric_of", lambda i, j: None)
    monkeypatch.setattr(router, "_link", lambda i, j: None)
    router._DIST_AFTER = 1 << 60
    return router


def _nic_pairs(G, seed, n=300):
    rng = random.Random(seed)
    nics = sorted((x for x, d in G.nodes(data=True) if d.get("kind") == "nic"), key=str)
    return [(rng.choice(nics), rng.choice(nics)) for _ in range(n)]


@pytest.mark.parametrize("spec", CLUSTERS[::2] + [
    "cluster:dgx_a100x9,fabric=rail,nodes_per_unit=4",
    "cluster:dgx_h100x12,fabric=leaf_spine,hosts_per_leaf=16,spines=3",
    "cluster:p5x6,fabric=leaf_spine,hosts_per_leaf=12,oversubscription=2"])
def test_nic_routes_through_the_fabric_tables_are_the_searched_ones(spec, monkeypatch):
    G = topologies.from_spec(spec)
    fast = Router(G)
    plain = _plain(Router(G), monkeypatch)
    pairs = _nic_pairs(G, seed=len(spec))
    for flow in (0, 5):
        for a, b in pairs:
            assert fast.path(a, b, flow) == plain.path(a, b, flow), (a, b, flow)
    for a, b in pairs[:60]:
        assert fast.equal_cost_paths(a, b) == plain.equal_cost_paths(a, b)
    used = sum(fast._fabric_of(fast._index[a], fast._index[b]) is not None for a, b in pairs
               if G.nodes[a]["host"] != G.nodes[b]["host"])
    assert used > 0 or "rail" in spec          # a rail's cross-rail pairs go through machines


@pytest.mark.parametrize("seed", range(4))
def test_a_link_is_the_route_only_when_nothing_is_as_short(seed, monkeypatch):
    rng = random.Random(seed)
    G = topologies.from_spec("cluster:dgx_a100x4,fabric=fat_tree")
    for a, b, d in G.edges(data=True):
        d["latency"] = rng.choice([0.25e-6, 0.5e-6, 1e-6, 2e-6, 3e-6])
    fast = Router(G)
    plain = _plain(Router(G), monkeypatch)
    for a, b in G.edges:
        for x, y in ((a, b), (b, a)):
            assert fast.path(x, y, seed) == plain.path(x, y, seed), (x, y)


@pytest.mark.parametrize("seed", range(6))
def test_fabric_tables_refuse_a_shortcut_through_a_machine(seed, monkeypatch):
    # Random latencies on a rail fabric: some machines' PCIe becomes the shortest way
    # between two rails (as PXN uses it) or ties the spines; routes must stay the searched.
    rng = random.Random(seed)
    G = topologies.from_spec("cluster:dgx_h100x6,fabric=rail,nodes_per_unit=3")
    for a, b, d in G.edges(data=True):
        d["latency"] = rng.choice([0.25e-6, 0.5e-6, 1e-6, 1.5e-6])
    fast = Router(G)
    plain = _plain(Router(G), monkeypatch)
    for a, b in _nic_pairs(G, seed, 400):
        assert fast.path(a, b, seed) == plain.path(a, b, seed), (a, b)


def test_routes_inside_a_machine_search_no_fabric():
    # 1,024 GPUs: each GPU is the destination of its machine's NICs and GPUs only, which
    # must not buy it a distance map over the whole cluster (that made the analysis
    # quadratic) nor search beyond the machine.
    G = topologies.from_spec("cluster:dgx_h100x128")
    r = Router(G)
    for h in range(128):
        for a in range(8):
            for b in range(8):
                r.path(f"n{h}.nic{a}", f"n{h}.gpu{b}")
                if a != b:
                    r.path(f"n{h}.gpu{a}", f"n{h}.gpu{b}")
    assert not r._dists and not r._dags
    assert len(r._host_kinds) == 1

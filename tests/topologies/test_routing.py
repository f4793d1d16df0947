import random
from collections import Counter

import networkx as nx
import pytest

import topologies as T
from topologies.routing import HOP


def cost(u, v, d):
    """The router's metric: picoseconds of latency first, hops second."""
    return round(d["latency"] * 1e12) * HOP + 1


def path_cost(G, p):
    return sum(cost(a, b, G.edges[a, b]) for a, b in zip(p, p[1:]))


def random_topology(seed):
    """A random connected graph with tied latencies and trees hanging off it (peeling)."""
    rng = random.Random(seed)
    H = nx.connected_watts_strogatz_graph(40, 4, 0.3, seed=seed)
    G = nx.Graph(name="random")
    for n in H:
        G.add_node(f"s{n}", kind="switch")
    for a, b in H.edges:
        G.add_edge(f"s{a}", f"s{b}", bandwidth=1e9, latency=rng.choice([1e-6, 2e-6]))
    rank = 0
    for n in list(H)[:20]:
        # a small hanging tree: s -> t{n} -> (gpu, gpu), plus a GPU directly on s
        G.add_node(f"t{n}", kind="switch")
        G.add_edge(f"s{n}", f"t{n}", bandwidth=1e9, latency=rng.choice([1e-6, 3e-6]))
        for _ in range(2):
            G.add_node(f"gpu{rank}", kind="gpu", rank=rank)
            G.add_edge(f"t{n}", f"gpu{rank}", bandwidth=1e9, latency=1e-6)
            rank += 1
        G.add_node(f"gpu{rank}", kind="gpu", rank=rank)
        G.add_edge(f"s{n}", f"gpu{rank}", bandwidth=1e9, latency=1e-6)
        rank += 1
    return T.validate_topology(G)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_routes_are_shortest_and_equal_cost_sets_exact(seed):
    G = random_topology(seed)
    R = T.Router(G)
    dist = dict(nx.all_pairs_dijkstra_path_length(G, weight=cost))
    nodes = sorted(G.nodes)
    rng = random.Random(seed)
    for src in nodes:
        for dst in rng.sample(nodes, 12):
            p = R.path(src, dst, flow=rng.randrange(100))
            assert p[0] == src and p[-1] == dst
            assert all(G.has_edge(a, b) for a, b in zip(p, p[1:]))
            assert path_cost(G, p) == dist[src][dst]
    for src, dst in [(nodes[i], nodes[-1 - i]) for i in range(0, 40, 3)]:
        want = sorted(tuple(p) for p in nx.all_shortest_paths(G, src, dst, weight=cost))
        assert R.equal_cost_paths(src, dst) == want


def test_latency_first_then_hops():
    G = nx.Graph(name="tie")
    for n in "abcd":
        G.add_node(n, kind="gpu", rank="abcd".index(n))
    G.add_edge("a", "d", bandwidth=1.0, latency=3e-6)               # 1 hop, 3 us
    G.add_edge("a", "b", bandwidth=1.0, latency=1e-6)               # 3 hops, 3 us
    G.add_edge("b", "c", bandwidth=1.0, latency=1e-6)
    G.add_edge("c", "d", bandwidth=1.0, latency=1e-6)
    R = T.Router(G)
    assert R.path("a", "d") == ("a", "d")                           # equal latency: fewer hops
    G.edges["a", "d"]["latency"] = 3.5e-6
    assert T.Router(G).path("a", "d") == ("a", "b", "c", "d")       # lower latency wins
    assert T.Router(G).latency("a", "d") == pytest.approx(3e-6)


def test_fat_tree_ecmp_spreads_flows_over_all_core_paths():
    G = T.fat_tree(4)
    R = T.Router(G)
    paths = R.equal_cost_paths("gpu0", "gpu15")
    assert len(paths) == 4                                          # (k/2)**2 via the cores
    assert len(R.equal_cost_paths("gpu0", "gpu3")) == 2            # same pod: k/2 aggregations
    used = Counter(R.path("gpu0", "gpu15", flow) for flow in range(400))
    assert set(used) == set(paths)
    assert all(70 <= c <= 130 for c in used.values()), used        # 100 each expected
    cores = Counter(R.path(f"gpu{s}", f"gpu{d}", 0)[3] for s in range(4) for d in range(12, 16))
    assert len(cores) == 4                                          # different pairs spread too


def test_routes_are_deterministic_and_independent_of_insertion_order():
    G = T.cluster("dgx_a100", 4, fabric="rail", nodes_per_unit=2)
    H = nx.Graph()
    H.graph.update(G.graph)
    H.add_nodes_from(reversed(list(G.nodes(data=True))))
    H.add_edges_from(reversed(list(G.edges(data=True))))
    R1, R2, R3 = T.Router(G), T.Router(G), T.Router(H)
    order = T.gpus(G)
    for s in range(0, 32, 3):
        for d in range(1, 32, 5):
            for flow in (0, 1, "t7"):
                p = R1.path(order[s], order[d], flow)
                assert R2.path(order[s], order[d], flow) == p
                assert R3.path(order[s], order[d], flow) == p


def test_channels_and_cache():
    G = T.switch(4)
    R = T.Router(G)
    assert R.channels("gpu0", "gpu3") == (("gpu0", "sw0"), ("sw0", "gpu3"))
    assert R.channels("gpu2", "gpu2") == ()
    assert R.path("gpu2", "gpu2") == ("gpu2",)
    assert R.path("gpu0", "gpu3") is R.path("gpu0", "gpu3")        # cached


def test_dgx_routes_prefer_nvlink_like_nccl():
    R = T.Router(T.dgx_a100())
    assert R.path("gpu0", "gpu7") == ("gpu0", "nvswitch", "gpu7")
    assert R.path("gpu0", "nic1") in {("gpu0", "pcie0", "nic1")}
    V = T.Router(T.dgx1_v100())
    assert V.path("gpu0", "gpu3") == ("gpu0", "gpu3")
    assert set(V.equal_cost_paths("gpu1", "gpu4")) == {("gpu1", "gpu0", "gpu4"),
                                                       ("gpu1", "gpu5", "gpu4")}


def test_cluster_cross_node_route_uses_nics_and_fabric():
    G = T.cluster("dgx_a100", 2, fabric="leaf_spine")
    R = T.Router(G)
    p = R.path("n0.gpu0", "n1.gpu0")
    kinds = [G.nodes[n]["kind"] for n in p]
    assert kinds == ["gpu", "switch", "nic", "switch", "nic", "switch", "gpu"]
    assert p[3] == "leaf0"


def test_tree_routes_inside_hanging_subtrees():
    G = nx.Graph(name="tree")
    G.add_node("root", kind="switch")
    G.add_node("mid", kind="switch")
    for r in range(3):
        G.add_node(f"g{r}", kind="gpu", rank=r)
    G.add_edge("root", "mid", bandwidth=1.0, latency=1e-6)
    G.add_edge("mid", "g0", bandwidth=1.0, latency=1e-6)
    G.add_edge("mid", "g1", bandwidth=1.0, latency=1e-6)
    G.add_edge("root", "g2", bandwidth=1.0, latency=1e-6)
    R = T.Router(G)
    assert R.path("g0", "g1") == ("g0", "mid", "g1")
    assert R.path("g0", "g2") == ("g0", "mid", "root", "g2")
    assert R.path("g2", "mid") == ("g2", "root", "mid")


def test_routing_errors():
    R = T.Router(T.ring(4))
    with pytest.raises(T.RoutingError, match="node 'gpu9' is not in the topology"):
        R.path("gpu0", "gpu9")
    with pytest.raises(T.RoutingError, match=r"node \[1\] is not in the topology"):
        R.path([1], "gpu0")
    with pytest.raises(T.RoutingError, match=r"flow \[2\] must be hashable"):
        R.path("gpu0", "gpu1", [2])
    G = nx.Graph()
    for n in "abcdef":
        G.add_node(n, kind="gpu", rank="abcdef".index(n))
    nx.add_cycle(G, "abc", bandwidth=1.0, latency=1e-6)
    nx.add_cycle(G, "def", bandwidth=1.0, latency=1e-6)
    with pytest.raises(T.RoutingError, match="partitioned"):
        T.Router(G).path("a", "e")
    G.edges["a", "b"]["latency"] = 0.0
    with pytest.raises(T.ValidationError, match="latency=0.0"):
        T.Router(G)


@pytest.mark.slow
def test_8192_gpu_cluster_ring_neighbours_are_shortest():
    G = T.from_spec("cluster:dgx_a100x1024,fabric=rail")
    R = T.Router(G)
    order = T.gpus(G)
    n = len(order)
    rng = random.Random(0)
    check = set(rng.sample(range(n), 6)) | {7, 8191}
    for r in range(n):
        p = R.path(order[r], order[(r + 1) % n], r)
        if r in check:
            want = nx.dijkstra_path_length(G, order[r], order[(r + 1) % n], weight=cost)
            assert path_cost(G, p) == want
            assert all(G.has_edge(a, b) for a, b in zip(p, p[1:]))
    # the cross-node hop rides one rail switch plus one NVLink hop on either side (as NCCL's
    # PXN does), never a spine
    for flow in range(8):
        p = R.path("n0.gpu7", "n1.gpu0", flow)
        assert not any(x.startswith("spine") for x in p)
        assert sum(x.endswith("nvswitch") for x in p) == 1 and len(p) == 9


def test_one_router_per_graph_shared_and_rebuilt_when_the_graph_changes():
    import topologies

    G = topologies.switch(4)
    r = topologies.router_of(G)
    assert topologies.router_of(G) is r
    assert topologies.router_of(topologies.switch(4)) is not r        # another graph
    G.edges["gpu0", "sw0"]["latency"] = 5e-6                          # changed in place
    r2 = topologies.router_of(G)
    assert r2 is not r and r2.path("gpu0", "gpu1") == topologies.Router(G).path("gpu0", "gpu1")


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x3,fabric=leaf_spine", "cluster:dgx_a100x2",
                                  "dgx1_v100"])
def test_routes_kept_per_pair_are_every_flows_route(spec):
    """The router keeps a route no flow label changes (a link every other way beats, a
    machine's only shortest route) per node pair: every (src, dst, flow), asked in any order
    and again, is the route a router that keeps nothing finds (max_cached_paths=0)."""
    G = T.from_spec(spec)
    rng = random.Random(7)
    nodes = sorted(G.nodes)
    asks = [(rng.choice(nodes), rng.choice(nodes), rng.randrange(6)) for _ in range(600)]
    kept, fresh = T.Router(G), T.Router(G, max_cached_paths=0)
    got = [kept.path(a, b, f) for a, b, f in asks + asks[::-1]]
    assert got == [fresh.path(a, b, f) for a, b, f in asks + asks[::-1]]
    assert kept._free and not fresh._free       # the per-pair table was used, and is bounded
    if spec.startswith("cluster"):          # a machine's own legs among them
        machine = {n for n in nodes if G.nodes[n].get("host") == 0}
        assert any(a in machine and b in machine and a != b and not G.has_edge(a, b)
                   for a, b in kept._free)

from collections import Counter

import networkx as nx
import pytest

import topologies as T


def kinds(G):
    return Counter(d["kind"] for _, d in G.nodes(data=True))


@pytest.mark.parametrize("n", [2, 3, 8, 17])
def test_ring(n):
    G = T.ring(n, bandwidth=1e9, latency=2e-6)
    assert G.number_of_nodes() == n
    assert G.number_of_edges() == (1 if n == 2 else n)
    if n > 2:
        assert all(deg == 2 for _, deg in G.degree())
    assert T.gpus(G) == [f"gpu{r}" for r in range(n)]
    assert all(d["bandwidth"] == 1e9 and d["latency"] == 2e-6 for *_, d in G.edges(data=True))
    assert G.graph["name"] == f"ring:{n}"


@pytest.mark.parametrize("n", [2, 5, 8])
def test_fully_connected(n):
    G = T.fully_connected(n)
    assert G.number_of_edges() == n * (n - 1) // 2
    assert all(deg == n - 1 for _, deg in G.degree())


@pytest.mark.parametrize("n", [1, 4, 16])
def test_switch(n):
    G = T.switch(n)
    assert kinds(G) == {"gpu": n, "switch": 1}
    assert G.degree("sw0") == n and G.number_of_edges() == n


@pytest.mark.parametrize("dims, edges", [((4, 4), 32), ((3, 5), 30), ((4, 4, 4), 192),
                                         ((2, 3), 9), ((2, 2, 2), 12), ((6,), 6)])
def test_torus(dims, edges):
    G = T.torus(dims)
    n = 1
    for d in dims:
        n *= d
    assert G.number_of_nodes() == n and G.number_of_edges() == edges
    if min(dims) >= 3:
        assert all(deg == 2 * len(dims) for _, deg in G.degree())
    assert G.nodes["gpu1"]["coord"] == ",".join(["0"] * (len(dims) - 1) + ["1"])


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_fat_tree_counts(k):
    G = T.fat_tree(k)
    c = kinds(G)
    assert c["gpu"] == k ** 3 // 4
    assert c["switch"] == 5 * k * k // 4
    assert G.number_of_edges() == 3 * k ** 3 // 4
    tiers = Counter(d.get("tier") for _, d in G.nodes(data=True) if d["kind"] == "switch")
    assert tiers == {"core": k * k // 4, "aggregation": k * k // 2, "edge": k * k // 2}
    # every switch has k ports; core switches too (one per pod)
    assert all(G.degree(n) == k for n, d in G.nodes(data=True) if d["kind"] == "switch")


def test_fat_tree_host_placement():
    G = T.fat_tree(4)
    assert set(G["gpu0"]) == {"pod0.edge0"} and set(G["gpu2"]) == {"pod0.edge1"}
    assert set(G["gpu15"]) == {"pod3.edge1"}


def test_leaf_spine_counts_and_oversubscription():
    G = T.leaf_spine(4, 2, 8, bandwidth=10e9, oversubscription=2.0)
    assert kinds(G) == {"gpu": 32, "switch": 6}
    assert G.number_of_edges() == 4 * (8 + 2)
    up = G.edges["leaf0", "spine0"]["bandwidth"]
    assert up == pytest.approx(8 * 10e9 / (2.0 * 2))
    assert all(G.degree(f"spine{s}") == 4 for s in range(2))
    G2 = T.leaf_spine(2, 3, 4, uplink_bandwidth=7e9)
    assert G2.edges["leaf1", "spine2"]["bandwidth"] == 7e9


@pytest.mark.parametrize("routers, hosts, h, groups", [(4, 2, 2, None), (2, 1, 1, 3), (4, 3, 2, 5)])
def test_dragonfly_counts(routers, hosts, h, groups):
    G = T.dragonfly(groups, routers, hosts, h)
    g = routers * h + 1 if groups is None else groups
    assert kinds(G) == {"gpu": g * routers * hosts, "switch": g * routers}
    local = g * routers * (routers - 1) // 2
    glob = g * (g - 1) // 2
    assert G.number_of_edges() == local + glob + g * routers * hosts
    # no router has more than h global links
    per_router = Counter()
    for a, b, d in G.edges(data=True):
        if d.get("scope") == "global":
            per_router[a] += 1
            per_router[b] += 1
    assert max(per_router.values()) <= h
    # every pair of groups is joined exactly once
    pairs = Counter(frozenset((G.nodes[a]["group"], G.nodes[b]["group"]))
                    for a, b, d in G.edges(data=True) if d.get("scope") == "global")
    assert len(pairs) == glob and set(pairs.values()) == {1}


def test_dgx1_v100_hybrid_cube_mesh():
    G = T.dgx1_v100()
    nv = [(a, b, d) for a, b, d in G.edges(data=True) if d["link"] == "nvlink"]
    assert len(nv) == 16
    lanes = Counter()
    for a, b, d in nv:
        lanes[a] += d["lanes"]
        lanes[b] += d["lanes"]
        assert d["bandwidth"] == d["lanes"] * 25e9
    assert all(lanes[f"gpu{g}"] == 6 for g in range(8))  # six NVLink2 per V100
    # quads fully connected, plus i <-> i+4
    for g in range(4):
        assert G.has_edge(f"gpu{g}", f"gpu{g + 4}")
        assert all(G.has_edge(f"gpu{g}", f"gpu{o}") for o in range(4) if o != g)
    assert not G.has_edge("gpu0", "gpu5")
    assert kinds(G) == {"gpu": 8, "nic": 4, "switch": 4, "cpu": 2}


@pytest.mark.parametrize("build, bw, nic", [(T.dgx_a100, 300e9, 25e9), (T.dgx_h100, 450e9, 50e9)])
def test_nvswitch_boxes(build, bw, nic):
    G = build()
    assert kinds(G) == {"gpu": 8, "nic": 8, "switch": 5, "cpu": 2}
    assert G.number_of_edges() == 28
    assert all(G.edges[f"gpu{g}", "nvswitch"]["bandwidth"] == bw for g in range(8))
    assert all(G.nodes[f"nic{n}"]["bandwidth"] == nic for n in range(8))
    # two GPUs and two NICs per PCIe switch
    for p in range(4):
        nbrs = Counter(G.nodes[n]["kind"] for n in G[f"pcie{p}"])
        assert nbrs == {"gpu": 2, "nic": 2, "cpu": 1}


def test_pcie_box_and_p2():
    G = T.pcie_box()
    assert kinds(G) == {"gpu": 8, "switch": 2, "cpu": 2, "nic": 1}
    assert all(d["link"] in ("pcie", "qpi") for *_, d in G.edges(data=True))
    G4 = T.pcie_box(4, gpus_per_switch=2, pcie_gen=4, nics=2)
    assert G4.edges["gpu0", "pcie0"]["bandwidth"] == 31.5e9 and kinds(G4)["nic"] == 2
    P = T.p2_16xlarge()
    assert len(T.gpus(P)) == 16
    assert all(P.nodes[g]["model"] == "K80-GK210" for g in T.gpus(P))
    # the two GPUs of a K80 board share its on-board switch
    assert set(P["gpu0"]) == set(P["gpu1"]) == {"k80_0"}


@pytest.mark.parametrize("fabric", ["leaf_spine", "fat_tree", "rail"])
def test_cluster_ranks_node_major_and_nics_joined(fabric):
    G = T.cluster("dgx_a100", 3, fabric=fabric)
    T.validate_topology(G)
    order = T.gpus(G)
    assert order == [f"n{i}.gpu{j}" for i in range(3) for j in range(8)]
    assert all(G.nodes[f"n{i}.gpu0"]["host"] == i for i in range(3))
    for i in range(3):
        for j in range(8):
            nic = f"n{i}.nic{j}"
            fabric_nbrs = [n for n in G[nic] if not n.startswith(f"n{i}.")]
            assert len(fabric_nbrs) == 1 and G.nodes[fabric_nbrs[0]]["kind"] == "switch"
            assert G.edges[nic, fabric_nbrs[0]]["bandwidth"] == 25e9
            assert G.edges[nic, fabric_nbrs[0]]["link"] == "ib"


def test_cluster_rail_puts_nic_j_on_rail_j():
    G = T.cluster("dgx_h100", 4, fabric="rail", nodes_per_unit=2)
    for i in range(4):
        for j in range(8):
            assert G.has_edge(f"n{i}.nic{j}", f"su{i // 2}.rail{j}")
    assert G.edges["n0.nic0", "su0.rail0"]["bandwidth"] == 50e9


def test_cluster_leaf_spine_fills_leaves_and_sizes_uplinks():
    G = T.cluster("dgx_a100", 8, fabric="leaf_spine", hosts_per_leaf=16, oversubscription=2.0)
    leaves = [n for n, d in G.nodes(data=True) if d.get("tier") == "leaf"]
    spines = [n for n, d in G.nodes(data=True) if d.get("tier") == "spine"]
    assert len(leaves) == 4 and len(spines) == 8
    assert G.has_edge("n0.nic0", "leaf0") and G.has_edge("n1.nic7", "leaf0")
    assert G.has_edge("n2.nic0", "leaf1")
    assert G.edges["leaf0", "spine0"]["bandwidth"] == pytest.approx(16 * 25e9 / (2 * 8))


def test_cluster_of_a_custom_machine_graph_and_nic_bandwidth():
    m = T.pcie_box(4, gpus_per_switch=2, nics=2)
    G = T.cluster(m, 2, fabric="fat_tree", nic_bandwidth=5e9, link="ethernet")
    assert len(T.gpus(G)) == 8
    fab = [d for a, b, d in G.edges(data=True) if d["link"] == "ethernet"]
    assert fab and all(d["bandwidth"] == 5e9 for d in fab)


def _machine_with_bare_nic():
    G = T.switch(2)
    G.graph["name"] = "box"
    G.add_node("nic0", kind="nic")
    G.add_edge("nic0", "sw0", bandwidth=1e9, latency=1e-6)
    return G


@pytest.mark.parametrize("call, words", [
    (lambda: T.ring(1), "ring: n=1 must be >= 2"),
    (lambda: T.ring(4.0), "ring: n=4.0 must be an integer"),
    (lambda: T.ring(4, bandwidth="10Gbit"), "must be a number in SI units"),
    (lambda: T.ring(4, latency=-1.0), "latency=-1.0 must be positive"),
    (lambda: T.switch(3, link=""), "link=''"),
    (lambda: T.fat_tree(5), "k=5 must be even"),
    (lambda: T.torus((4, 1)), r"dims\[1\]=1 must be >= 2"),
    (lambda: T.torus((2, 2, 2, 2)), "1 to 3 dimensions"),
    (lambda: T.leaf_spine(0, 1, 1), "leaves=0"),
    (lambda: T.dragonfly(20, 4, 2, 2), "groups=20 needs more global ports"),
    (lambda: T.pcie_box(6, gpus_per_switch=4), "not a multiple"),
    (lambda: T.pcie_box(pcie_gen=7), "pcie_gen=7"),
    (lambda: T.pcie_box(nics=5), "nics=5"),
    (lambda: T.cluster("dgx_z", 2), "node='dgx_z' is not a preset"),
    (lambda: T.cluster("dgx_a100", 2, fabric="mesh"), "fabric='mesh' is not known"),
    (lambda: T.cluster(T.ring(4), 2), "has no 'nic' node"),
    (lambda: T.cluster(_machine_with_bare_nic(), 2), "NIC 'nic0' of 'box' has no 'bandwidth'"),
    (lambda: T.ring(4, bandwidth=None), "bandwidth=None must be a number"),
    (lambda: T.torus(None), "dims=None must be a sequence"),
    (lambda: T.dragonfly(1), "groups=1 must be >= 2"),
    (lambda: T.leaf_spine(2, 2, 2, uplink_bandwidth=0.0), "uplink_bandwidth=0.0"),
    (lambda: T.cluster("dgx_a100", 2, fabric="fat_tree", k=2), "k=2 gives 2 host ports"),
    (lambda: T.cluster("dgx_a100", 2, fabric="leaf_spine", k=4), "options: hosts_per_leaf"),
    (lambda: T.cluster("dgx_a100", 2, fabric="rail", bogus=1), "option bogus=1 is not an option of fabric 'rail'"),
])
def test_builder_errors_name_the_argument(call, words):
    with pytest.raises(T.SpecError, match=words):
        call()


@pytest.mark.parametrize("name", list(T.PRESETS))
def test_presets_are_valid_and_cite_sources(name):
    G = T.validate_topology(T.PRESETS[name]())
    assert nx.is_connected(G)
    doc = T.PRESETS[name].__doc__
    assert any(w in doc for w in ("Sources", "datasheet", "white paper"))

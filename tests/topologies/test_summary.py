import pytest

import topologies as T


@pytest.mark.parametrize("G, expected", [
    (T.ring(8, bandwidth=1e9), 2e9),                                 # two links cut the ring
    (T.ring(2, bandwidth=1e9), 1e9),
    (T.switch(16, bandwidth=1e9), 8e9),                              # half the GPU links
    (T.switch(5, bandwidth=1e9), 2e9),                               # the smaller half (2)
    (T.fully_connected(4, bandwidth=1e9), 4e9),                      # 2 x 2 links across
    (T.fat_tree(4, bandwidth=1e9), 8e9),                             # full bisection: k**3/8
    (T.fat_tree(8, bandwidth=1e9), 64e9),
    (T.torus((4, 4, 4), bandwidth=1e9), 32e9),                       # 2 * 4 * 4 wrap-around cut
    (T.torus((4, 4), bandwidth=1e9), 8e9),
    (T.leaf_spine(4, 2, 8, bandwidth=1e9, oversubscription=4.0), 4e9),  # 2 leaves' uplinks: 2*8/4
    (T.leaf_spine(4, 2, 8, bandwidth=1e9), 16e9),
    (T.dgx_a100(), 4 * 300e9),                                      # 4 GPU links to NVSwitch
    (T.cluster("dgx_a100", 4, fabric="leaf_spine"), 16 * 25e9),     # 2 nodes x 8 HDR NICs
])
def test_bisection_by_hand(G, expected):
    assert T.bisection_bandwidth(G) == pytest.approx(expected)


def test_bisection_of_a_single_gpu_is_zero():
    assert T.bisection_bandwidth(T.switch(1)) == 0.0


def test_summary_counts_and_classes():
    s = T.summary(T.dgx1_v100())
    assert (s["gpus"], s["nodes"], s["links"], s["switches"], s["nics"], s["cpus"]) == \
        (8, 18, 33, 4, 4, 2)
    assert s["links_by_class"] == {"nvlink": 16, "pcie": 16, "qpi": 1}
    assert s["bandwidth_by_class"]["nvlink"] == pytest.approx(24 * 25e9)  # 48 lanes / 2
    assert s["name"] == "dgx1_v100"
    assert s["min_link_bandwidth"] == 12.5e9 or s["min_link_bandwidth"] == 15.75e9
    assert s["max_link_latency"] == pytest.approx(0.6e-6)


@pytest.mark.parametrize("G, diameter", [(T.ring(8), 4), (T.ring(9), 4), (T.switch(6), 2),
                                         (T.fat_tree(4), 6), (T.torus((4, 4, 4)), 6),
                                         (T.fully_connected(5), 1)])
def test_diameter_in_hops(G, diameter):
    assert T.summary(G)["diameter"] == diameter


def test_total_bandwidth():
    assert T.summary(T.ring(8, bandwidth=2e9))["total_bandwidth"] == pytest.approx(16e9)


@pytest.mark.parametrize("seed", range(12))
def test_diameter_with_hanging_trees_matches_networkx(seed):
    import random

    import networkx as nx
    rng = random.Random(seed)
    if seed % 3 == 0:
        G = nx.random_labeled_tree(25, seed=seed)
    else:
        G = nx.connected_watts_strogatz_graph(25, 2 + 2 * (seed % 2), 0.2, seed=seed)
    G = nx.relabel_nodes(G, str)
    for i in range(12):                      # hosts and chains hanging off random nodes
        G.add_edge(rng.choice(list(G)), f"h{i}")
    assert T.diameter(G) == nx.diameter(G)


def test_diameter_of_big_symmetric_fabrics_is_fast_and_exact():
    assert T.diameter(T.fat_tree(32)) == 6          # host-edge-agg-core-agg-edge-host
    assert T.diameter(T.torus((8, 8, 8))) == 12     # 3 * 8/2


def test_diameter_of_disconnected_graph_raises():
    import networkx as nx
    G = nx.Graph()
    nx.add_cycle(G, ["a", "b", "c"])
    nx.add_cycle(G, ["d", "e", "f"])
    with pytest.raises(T.ValidationError, match="not connected"):
        T.diameter(G)

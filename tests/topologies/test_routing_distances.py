"""Router: next hops from a destination's distance map (used once a destination has many
routes) are the next hops of the pair search, in the same order, so routes do not change."""
import pytest

import topologies
from topologies.routing import Router

SPECS = ["fat_tree:k=8", "cluster:dgx_a100x4", "cluster:dgx_a100x8,nic_bw=25Gbit", "dgx1_v100",
         "torus:4x4", "leaf_spine:leaves=4,spines=3,hosts=4",
         "dragonfly:groups=4,routers=4,hosts=2", "cluster:dgx_h100x4,fabric=leaf_spine"]


@pytest.mark.parametrize("spec", SPECS)
def test_distance_maps_route_as_pair_searches(spec, monkeypatch):
    G = topologies.from_spec(spec)
    gpus = topologies.gpus(G)
    nodes = sorted(G.nodes, key=str)
    pairs = [(a, b) for a in gpus for b in gpus if a != b] + \
        [(a, b) for a in nodes[::7] for b in nodes[::5] if a != b]
    searched = Router(G)
    monkeypatch.setattr(searched, "_DIST_AFTER", 1 << 60)     # never a distance map
    mapped = Router(G)
    monkeypatch.setattr(mapped, "_DIST_AFTER", 1)             # always one
    for flow in (0, 5):
        for a, b in pairs:
            assert mapped.path(a, b, flow) == searched.path(a, b, flow), (a, b, flow)
    assert mapped._dists and not searched._dists


def test_partition_is_reported_by_either():
    G = topologies.switch(4)
    G.remove_edge("gpu3", "sw0")
    G.add_edge("gpu3", "x", bandwidth=1.0, latency=1e-6)
    r = Router(G)
    r._DIST_AFTER = 1
    with pytest.raises(topologies.RoutingError, match="partitioned"):
        r.path("gpu0", "gpu3")


@pytest.mark.parametrize("lat", [1e-6, 0.02, 5.0])
def test_compiled_and_python_distance_maps_agree(lat):
    # Costs are latency in ps x 2**20: 20-ms links overflow what a float64 holds
    # exactly, so those maps are computed in Python, and seconds-long paths what an int64
    # holds; every way must route as the pair search.
    G = topologies.from_spec("leaf_spine:leaves=4,spines=3,hosts=4")
    for a, b in G.edges:
        G.edges[a, b]["latency"] = lat * (1 + len(str(a) + str(b)) % 3)
    gpus = topologies.gpus(G)
    searched = Router(G)
    searched._DIST_AFTER = 1 << 60
    mapped = Router(G)
    mapped._DIST_AFTER = 1
    for a in gpus:
        for b in gpus:
            assert mapped.path(a, b, 3) == searched.path(a, b, 3)
    assert (mapped._csr is False) == (lat > 1e-3)

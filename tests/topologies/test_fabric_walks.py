"""Router.equal_cost_paths between NICs through the fabric's kept walks per leaf pair
(topologies/fabric.py FabricRoutes.walks): the same paths, in the same order, as the walk per
pair it replaced (the reference below is that code)."""
import itertools

import pytest

import topologies
from topologies.routing import router_of


def _reference(router, src, dst, limit):
    """equal_cost_paths' fabric branch before the walks were kept: one walk per NIC pair."""
    i, j = router._node(src), router._node(dst)
    fr, (la, lb, dest) = router._fabric_of(i, j)
    out = []

    def walk(u, acc):
        if len(out) >= limit:
            return
        if u == lb:
            out.append(tuple(router._names[x] for x in [i] + acc + [j]))
            return
        for v in fr.next_hops(u, dest):
            walk(v, acc + [v])

    walk(la, [la])
    return sorted(out, key=lambda p: [str(x) for x in p])


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x6,fabric=leaf_spine",
                                  "cluster:dgx_a100x8,fabric=rail",
                                  "cluster:dgx_a100x5,fabric=fat_tree",
                                  "cluster:pcie_boxx4,fabric=leaf_spine"])
@pytest.mark.parametrize("limit", [1024, 3])
def test_nic_paths_equal_the_walk_per_pair(spec, limit):
    G = topologies.from_spec(spec)
    r = router_of(G)
    nics = sorted(n for n, d in G.nodes(data=True) if d.get("kind") == "nic")
    seen = 0
    for a, b in itertools.islice(itertools.permutations(nics, 2), 0, None, 3):
        if r._fabric_of(r._node(a), r._node(b)) is None:
            continue
        seen += 1
        assert r.equal_cost_paths(a, b, limit=limit) == _reference(r, a, b, limit)
        assert r.equal_cost_paths(a, b, limit=limit) == _reference(r, a, b, limit)  # kept
    assert seen

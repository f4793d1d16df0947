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


def _route_reference(fr, a, b):
    """FabricRoutes._route before the proofs went in bulk (FabricRoutes.prove)."""
    import math

    import numpy as np

    ea, eb = fr.exits.get(a), fr.exits.get(b)
    r = fr.router
    if ea is None or eb is None or r._host[a] == r._host[b] or len(ea) != 1 or len(eb) != 1:
        return None
    (la, ca), (lb, cb) = ea[0], eb[0]
    DF, DV = fr._tables()
    ia, ib = fr.index[la], fr.index[lb]
    if not math.isfinite(DF[ia, ib]) or DV[ia, ib] != 2.0 * DF[ia, ib]:
        return None
    direct = ca + DF[ia, ib] + cb
    xa, lxa, A = fr._ways(a)[:3]
    yb, lyb, B = fr._ways(b)[:3]
    alt = A[:, None] + DV[np.ix_(lxa, lyb)] / 2.0 + B[None, :]
    alt[(xa == a)[:, None] & (yb == b)[None, :]] = np.inf
    if alt.min() <= direct:
        return None
    return la, lb, ib


@pytest.mark.parametrize("spec", ["cluster:dgx_h100x6,fabric=leaf_spine",
                                  "cluster:dgx_a100x8,fabric=rail",
                                  "cluster:dgx_a100x5,fabric=fat_tree",
                                  "cluster:pcie_boxx4,fabric=leaf_spine",
                                  "cluster:p4dx3,fabric=rail"])
def test_bulk_proofs_equal_the_proof_per_pair(spec):
    """Every node pair of machines and NICs: route() after prove() of all pairs at once, and
    route() alone, give the per-pair proof's answer (the fat tree's fail some)."""
    from topologies.fabric import FabricRoutes

    G = topologies.from_spec(spec)
    r = router_of(G)
    nodes = [k for k, h in enumerate(r._host) if h is not None]
    nodes = [k for k in nodes if G.nodes[r._names[k]].get("kind") in ("nic", "gpu")]
    pairs = list(itertools.permutations(nodes, 2))
    bulk, single = FabricRoutes(r), FabricRoutes(r)
    assert bulk.ok
    bulk.prove(pairs)
    want = [_route_reference(single, a, b) for a, b in pairs]
    assert [bulk.route(a, b) for a, b in pairs] == want
    assert [single.route(a, b) for a, b in pairs] == want
    assert any(w is not None for w in want)


@pytest.mark.parametrize("seed", range(6))
def test_dense_tables_equal_scipy_dijkstra(seed, monkeypatch):
    """FabricRoutes' tables by Floyd-Warshall (small fabrics) equal scipy's Dijkstra, which
    bigger fabrics use: random directed graphs with whole-number costs, some unreachable
    pairs, both branches forced."""
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    from topologies import fabric

    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 60))
    k = int(rng.integers(1, 4 * m))
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, m, size=(k, 2)) if a != b}
    rows, cols = [a for a, _ in pairs], [b for _, b in pairs]
    cost = rng.integers(1, 10**9, size=len(pairs)).astype(float) * 2.0 - (seed % 2)
    want = dijkstra(csr_matrix((cost, (rows, cols)), shape=(m, m)), directed=True)
    got = fabric._all_pairs(m, rows, cols, cost)
    assert np.array_equal(got, want)
    monkeypatch.setattr(fabric, "_DENSE_UP_TO", 1)
    assert np.array_equal(fabric._all_pairs(m, rows, cols, cost), want)

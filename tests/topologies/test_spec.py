import networkx as nx
import pytest

import topologies as T


def same_graph(G, H):
    assert set(G.nodes) == set(H.nodes)
    assert dict(G.nodes(data=True)) == dict(H.nodes(data=True))
    edges = lambda X: {frozenset((a, b)): d for a, b, d in X.edges(data=True)}
    assert edges(G) == edges(H)


@pytest.mark.parametrize("spec, built", [
    ("ring:8", lambda: T.ring(8)),
    ("switch:16,bw=10Gbit,lat=5us", lambda: T.switch(16, bandwidth=1.25e9, latency=5e-6)),
    ("fat_tree:k=8,bw=100Gbit", lambda: T.fat_tree(8, bandwidth=12.5e9)),
    ("fat_tree:4", lambda: T.fat_tree(4)),
    ("leaf_spine:leaves=4,spines=2,hosts=8,oversub=3",
     lambda: T.leaf_spine(4, 2, 8, oversubscription=3.0)),
    ("leaf_spine:4,2,8", lambda: T.leaf_spine(4, 2, 8)),
    ("torus:4x4x4", lambda: T.torus((4, 4, 4))),
    ("torus:dims=3x5,link=ici", lambda: T.torus((3, 5), link="ici")),
    ("dragonfly:groups=5,routers=4,hosts=3,h=2,global_lat=2us",
     lambda: T.dragonfly(5, 4, 3, 2, global_latency=2e-6)),
    ("fully_connected:4,latency=100ns", lambda: T.fully_connected(4, latency=1e-7)),
    ("dgx_a100", T.dgx_a100),
    ("dgx1_v100", T.dgx1_v100),
    ("pcie_box:gpus=4,gpus_per_switch=2,gen=4", lambda: T.pcie_box(4, gpus_per_switch=2, pcie_gen=4)),
    ("cluster:dgx_a100x4,fabric=leaf_spine", lambda: T.cluster("dgx_a100", 4)),
    ("cluster:node=dgx_h100,nodes=2,fabric=rail,nic_bw=200Gbit",
     lambda: T.cluster("dgx_h100", 2, fabric="rail", nic_bandwidth=25e9)),
    ("cluster:dgx1_v100x2,fabric=fat_tree,k=4,lat=2us",
     lambda: T.cluster("dgx1_v100", 2, fabric="fat_tree", k=4, latency=2e-6)),
])
def test_spec_builds_what_the_builder_builds(spec, built):
    G = T.from_spec(spec)
    same_graph(G, built())
    assert G.graph["name"] == spec


def test_spec_whitespace_and_name():
    G = T.from_spec("  ring: 4 , bw = 1GB/s ")
    assert G.graph["name"] == "ring: 4 , bw = 1GB/s"
    assert G.edges["gpu0", "gpu1"]["bandwidth"] == 1e9


def test_every_family_has_a_working_example():
    for name, fam in T.FAMILIES.items():
        G = T.from_spec(fam.help)
        assert len(T.gpus(G)) >= 2, name


@pytest.mark.parametrize("spec, words", [
    ("", "is empty"),
    ("rign:8", "family 'rign' is not known"),
    ("ring:eight", r"n='eight' not understood"),
    ("ring:8,9", "item '9' not understood: ring takes no more positional values"),
    ("ring:8,speed=3", "parameter 'speed' is not known for ring"),
    ("ring:8,bw=10Gbt", "bw: bandwidth '10Gbt' not understood"),
    ("ring:8,,", "empty item"),
    ("ring:1", "ring: n=1 must be >= 2"),
    ("torus:4xx4", "dims='4xx4' not understood"),
    ("cluster:dgx_a100", "machines='dgx_a100' not understood"),
    ("cluster:dgx_zzzx2", "node='dgx_zzz' is not a preset"),
    ("cluster:dgx_a100x2,fabric=torus", "fabric='torus' is not known"),
    ("dgx_a100:gpus=4", "parameter 'gpus' is not known for dgx_a100"),
])
def test_spec_errors_name_the_part(spec, words):
    with pytest.raises(T.SpecError, match=words):
        T.from_spec(spec)


def test_parse_spec_returns_family_and_si_kwargs():
    assert T.parse_spec("switch:16,bw=10Gbit,lat=5us") == (
        "switch", {"n": 16, "bandwidth": 1.25e9, "latency": 5e-6})


def test_from_spec_accepts_file_paths(tmp_path):
    p = T.save(T.ring(4), tmp_path / "r.json")
    G = T.from_spec(str(p))
    assert isinstance(G, nx.Graph) and G.number_of_nodes() == 4
    assert T.from_spec(p).number_of_edges() == 4

import json

import pytest
import yaml

import topologies as T


def assert_identical(G, H):
    assert dict(G.graph) == dict(H.graph)
    assert dict(G.nodes(data=True)) == dict(H.nodes(data=True))
    edges = lambda X: {frozenset((a, b)): d for a, b, d in X.edges(data=True)}
    assert edges(G) == edges(H)
    for n, d in G.nodes(data=True):
        for k, v in d.items():
            assert type(H.nodes[n][k]) is type(v), (n, k)
    for a, b, d in G.edges(data=True):
        for k, v in d.items():
            assert type(H.edges[a, b][k]) is type(v), (a, b, k)


GRAPHS = ["dgx1_v100", "p2_16xlarge", "cluster:dgx_a100x2,fabric=rail", "p4d", "torus:3x3",
          "dragonfly:groups=3,routers=2,hosts=1,h=1", "leaf_spine:2,2,2,oversub=1.5"]


@pytest.mark.parametrize("spec", GRAPHS)
@pytest.mark.parametrize("suffix", [".json", ".graphml", ".yaml"])
def test_round_trip_is_identical(tmp_path, spec, suffix):
    G = T.from_spec(spec)
    path = T.save(G, tmp_path / f"topo{suffix}")
    assert_identical(G, T.load(path))


def test_json_has_format_and_version(tmp_path):
    path = T.save(T.ring(3), tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["format"] == "qsgd-topology" and data["version"] == 1 and "links" in data


def test_hand_written_yaml_description_with_units(tmp_path):
    text = """
format: qsgd-topology-spec
version: 1
name: two-gpus
comment: extra fields are kept and ignored
nodes: [{id: gpu0, kind: gpu, rank: 0}, {id: gpu1, kind: gpu, rank: 1}, {id: sw0, kind: switch}]
links:
  - {a: gpu0, b: sw0, bandwidth: 25GB/s, latency: 1us, link: nvlink}
  - {a: gpu1, b: sw0, bandwidth: 100Gbit, latency: 500ns}
"""
    path = tmp_path / "d.yaml"
    path.write_text(text)
    G = T.load(path)
    assert G.graph["name"] == "two-gpus"
    assert G.edges["gpu0", "sw0"] == {"bandwidth": 25e9, "latency": 1e-6, "link": "nvlink"}
    assert G.edges["gpu1", "sw0"]["bandwidth"] == 12.5e9
    assert T.gpus(G) == ["gpu0", "gpu1"]
    jpath = tmp_path / "d.json"
    jpath.write_text(json.dumps(yaml.safe_load(text)))
    assert_identical(G, T.load(jpath))


def write(tmp_path, data, name="bad.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def desc(**over):
    d = {"format": "qsgd-topology-spec", "version": 1,
         "nodes": [{"id": "gpu0", "kind": "gpu", "rank": 0}, {"id": "sw0", "kind": "switch"}],
         "links": [{"a": "gpu0", "b": "sw0", "bandwidth": "1GB/s", "latency": "1us"}]}
    d.update(over)
    return d


@pytest.mark.parametrize("data, words", [
    ("{not json", "not valid JSON"),
    ([1, 2], "top level must be a mapping"),
    ({"version": 1}, "format: missing"),
    (desc(format="other"), "format='other'"),
    (desc(version=2), "version=2 is not supported"),
    (desc(nodes=[]), "nodes: .* must be a non-empty list"),
    (desc(nodes=[{"id": 3, "kind": "gpu"}]), r"nodes\[0\].id: 3 must be a non-empty string"),
    (desc(nodes=[{"id": "gpu0", "kind": "gpu", "rank": 0}, {"id": "gpu0", "kind": "gpu"}]),
     r"nodes\[1\].id: 'gpu0' is already defined"),
    (desc(nodes=[{"id": "gpu0", "rank": 0}]), r"nodes\[0\].kind: missing"),
    (desc(links=[{"a": "gpu0", "b": "sw9", "bandwidth": 1, "latency": 1}]), r"links\[0\].b: 'sw9' is not a node"),
    (desc(links=[{"a": "gpu0", "b": "sw0", "latency": 1}]), r"links\[0\].bandwidth: missing"),
    (desc(links=[{"a": "gpu0", "b": "sw0", "bandwidth": "fast", "latency": 1}]),
     r"links\[0\].bandwidth: bandwidth 'fast' not understood"),
    (desc(links=[{"a": "gpu0", "b": "sw0", "bandwidth": 1, "latency": "1 fortnight"}]),
     r"links\[0\].latency: time '1 fortnight'"),
    (desc(links=[{"a": "gpu0", "b": "sw0", "bandwidth": 1, "latency": 1}] * 2),
     r"links\[1\]: link 'gpu0' - 'sw0' is already defined"),
    (desc(links="x"), "links: 'x' must be a list"),
])
def test_load_errors_name_the_field(tmp_path, data, words):
    with pytest.raises(T.SpecError, match=words):
        T.load(write(tmp_path, data))


def test_load_validates_the_graph(tmp_path):
    bad = desc(nodes=[{"id": "gpu0", "kind": "gpu", "rank": 1}, {"id": "sw0", "kind": "switch"}])
    with pytest.raises(T.ValidationError, match="rank 0 is missing"):
        T.load(write(tmp_path, bad))


def test_bad_suffix_and_bad_graphml(tmp_path):
    with pytest.raises(T.SpecError, match="suffix '.txt' not supported"):
        T.save(T.ring(3), tmp_path / "r.txt")
    with pytest.raises(T.SpecError, match="not valid GraphML"):
        T.load(write(tmp_path, "<graphml><oops", "g.graphml"))
    with pytest.raises(T.SpecError, match="not valid YAML"):
        T.load(write(tmp_path, "a: [1,", "g.yaml"))
    with pytest.raises(OSError):
        T.load(tmp_path / "missing.json")


def test_save_refuses_an_invalid_graph(tmp_path):
    G = T.ring(3)
    G.edges["gpu0", "gpu1"]["bandwidth"] = -1.0
    with pytest.raises(T.ValidationError, match="bandwidth=-1.0"):
        T.save(G, tmp_path / "r.json")

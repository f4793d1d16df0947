import math

import networkx as nx
import pytest

import topologies as T


def base():
    return T.switch(3)


def mutate(fn):
    G = base()
    fn(G)
    return G


@pytest.mark.parametrize("make, words", [
    (lambda: "ring:4", "must be a networkx Graph"),
    (lambda: nx.DiGraph(T.ring(3)), "undirected simple"),
    (lambda: nx.Graph(), "has no nodes"),
    (lambda: mutate(lambda G: G.add_node(7, kind="gpu", rank=3)), "node 7: id must be a string"),
    (lambda: mutate(lambda G: G.nodes["sw0"].update(kind="router")),
     "node 'sw0': kind='router' must be one of"),
    (lambda: mutate(lambda G: G.nodes["sw0"].pop("kind")), "node 'sw0': kind=None"),
    (lambda: mutate(lambda G: G.nodes["gpu1"].update(rank="1")), "node 'gpu1': rank='1' must be an integer"),
    (lambda: mutate(lambda G: G.nodes["gpu1"].update(rank=True)), "rank=True must be an integer"),
    (lambda: mutate(lambda G: G.nodes["gpu2"].update(rank=0)), "node 'gpu2': rank=0 is also the rank of node 'gpu0'"),
    (lambda: mutate(lambda G: G.nodes["gpu2"].update(rank=5)), "rank 2 is missing"),
    (lambda: mutate(lambda G: G.nodes["sw0"].update(rank=9)), "on a switch node"),
    (lambda: mutate(lambda G: (G.add_node("nic0", kind="nic", in_order_128="no"),
                               G.add_edge("nic0", "sw0", bandwidth=1e9, latency=1e-6))),
     "node 'nic0': in_order_128='no' must be True or False"),
    (lambda: nx.relabel_nodes(T.switch(1), {"gpu0": "x"}).subgraph(["sw0"]).copy(), "no GPU"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].update(bandwidth=0.0)),
     r"edge \('(gpu0|sw0)', '(sw0|gpu0)'\): bandwidth=0.0 must be a positive finite number \(bytes/s\)"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].update(bandwidth=math.inf)), "bandwidth=inf"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].update(latency=-1e-6)),
     r"latency=-1e-06 must be a positive finite number \(s\)"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].pop("latency")), "latency=None"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].update(latency="1us")), "latency='1us'"),
    (lambda: mutate(lambda G: G.edges["gpu0", "sw0"].update(link=3)), "link=3 must be a non-empty string"),
    (lambda: mutate(lambda G: G.add_edge("gpu0", "gpu0", bandwidth=1.0, latency=1.0)), "self-loop"),
    (lambda: mutate(lambda G: G.remove_edge("gpu2", "sw0")), "not connected: 2 parts; e.g. node 'gpu2'"),
])
def test_each_error_names_the_node_edge_and_value(make, words):
    with pytest.raises(T.ValidationError, match=words):
        T.validate_topology(make())


def test_valid_graph_is_returned_unchanged():
    G = T.dgx_a100()
    assert T.validate_topology(G) is G


def test_validation_error_is_a_topology_and_value_error():
    assert issubclass(T.ValidationError, T.TopologyError)
    assert issubclass(T.ValidationError, ValueError)

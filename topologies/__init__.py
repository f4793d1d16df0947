"""Cluster topologies as NetworkX graphs with bandwidth (bytes/s) and latency (s) on every link.

Conventions: an undirected ``nx.Graph``; node ids are strings; node attr ``kind`` in {"gpu",
"switch", "nic", "cpu"}; GPUs carry ``rank`` 0..N-1; each edge is one full-duplex link with
``bandwidth`` (bytes/s per direction), ``latency`` (s) and ``link`` (a class name such as
"nvlink", "pcie", "ib"); graph attr ``name`` is the spec it was built from.

>>> import topologies
>>> G = topologies.from_spec("fat_tree:k=4,bw=100Gbit")
>>> len(topologies.gpus(G)), topologies.Router(G).path("gpu0", "gpu1")
(16, ('gpu0', 'pod0.edge0', 'gpu1'))
"""
from ._graph import fingerprint, gpus
from .cluster import FABRICS, cluster
from .dragonfly import dragonfly
from .errors import RoutingError, SpecError, TopologyError, ValidationError
from .fat_tree import fat_tree
from .generic import fully_connected, ring, switch
from .hosts import LocalRoutes, machine_signature
from .io import load, save
from .leaf_spine import leaf_spine
from .machines import (PRESETS, a3_mega, bm_gpu_h100, dgx1_v100, dgx_a100, dgx_h100, hgx_b200,
                       hgx_h200, nd_h100_v5, p2_16xlarge, p4d, p4de, p5, pcie_box,
                       rtx4090_box)
from .routing import Router, router_of
from .spec import FAMILIES, from_spec, parse_spec
from .summary import bisection_bandwidth, diameter, summary
from .torus import torus
from .units import parse_bandwidth, parse_bytes, parse_time
from .validate import validate_topology

__all__ = [
    "TopologyError", "SpecError", "ValidationError", "RoutingError",
    "parse_bytes", "parse_bandwidth", "parse_time",
    "ring", "fully_connected", "switch", "torus", "fat_tree", "leaf_spine", "dragonfly",
    "dgx1_v100", "dgx_a100", "dgx_h100", "hgx_h200", "hgx_b200", "pcie_box", "rtx4090_box", "p2_16xlarge",
    "p4d", "p4de", "p5", "a3_mega", "bm_gpu_h100", "nd_h100_v5", "PRESETS",
    "cluster", "FABRICS", "from_spec", "parse_spec", "FAMILIES",
    "validate_topology", "gpus", "fingerprint", "Router", "router_of", "load", "save", "summary",
    "bisection_bandwidth",
    "diameter", "machine_signature", "LocalRoutes",
]

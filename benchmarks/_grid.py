"""The grid of clusters the error benchmarks sweep (``alltoall_error.py``,
``fastpath_error.py``): each machine kind on each fabric at each machine count, each size."""
from __future__ import annotations


def add_grid_arguments(ap) -> None:
    """The grid's options: ``--nodes`` (machines), ``--sizes``, ``--fabrics``, ``--machines``."""
    ap.add_argument("--nodes", default="2,8,32,128")
    ap.add_argument("--sizes", default="1MB,16MB,256MB,1GB")
    ap.add_argument("--fabrics", default="leaf_spine,rail")
    ap.add_argument("--machines", default="dgx_h100,dgx_a100")


def clusters(args):
    """``(spec, graph, GPUs)`` per machine kind, fabric and machine count of ``args``."""
    import topologies

    for machine in args.machines.split(","):
        for fabric in args.fabrics.split(","):
            for nodes in map(int, args.nodes.split(",")):
                spec = f"cluster:{machine}x{nodes},fabric={fabric}"
                G = topologies.from_spec(spec)
                yield spec, G, len(topologies.gpus(G))

"""A 2-D or 3-D torus of GPUs (direct network with wrap-around, as in TPU pods or Blue Gene)."""
from __future__ import annotations

import itertools

import networkx as nx

from ._graph import (DEFAULT_BANDWIDTH, DEFAULT_LATENCY, add_gpu, add_link, check_int,
                     check_link, check_positive, new_graph)
from .errors import SpecError


def torus(dims, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY,
          link: str = "generic") -> nx.Graph:
    """GPUs on a torus of shape ``dims`` with wrap-around links in every dimension.

    GPU ranks are row-major over the coordinates (the last dimension varies fastest); node
    ``gpu{r}`` carries ``coord``, the coordinates as a string ``"x,y,z"``.

    Parameters
    ----------
    dims : sequence of int
        1 to 3 sizes, each >= 2. A dimension of size 2 gives a single link between the two
        neighbours (a simple graph has no parallel edges); sizes >= 3 give 2 links per GPU.
    bandwidth, latency, link
        Bytes/s per direction, seconds and class of every link.

    Returns
    -------
    nx.Graph
        prod(dims) GPUs; prod(dims) links per dimension of size >= 3, half that per dimension of
        size 2.
    """
    if isinstance(dims, int):
        dims = (dims,)
    try:
        dims = tuple(dims)
    except TypeError:
        raise SpecError(f"torus: dims={dims!r} must be a sequence of sizes") from None
    if not 1 <= len(dims) <= 3:
        raise SpecError(f"torus: dims={dims!r} must have 1 to 3 dimensions")
    dims = tuple(check_int("torus", f"dims[{i}]", d, 2) for i, d in enumerate(dims))
    bandwidth = check_positive("torus", "bandwidth", bandwidth)
    latency = check_positive("torus", "latency", latency)
    link = check_link("torus", link)
    G = new_graph("torus:" + "x".join(map(str, dims)))
    coords = list(itertools.product(*(range(d) for d in dims)))
    index = {c: r for r, c in enumerate(coords)}
    for r, c in enumerate(coords):
        add_gpu(G, f"gpu{r}", r, coord=",".join(map(str, c)))
    for r, c in enumerate(coords):
        for axis, size in enumerate(dims):
            nxt = list(c)
            nxt[axis] = (c[axis] + 1) % size
            add_link(G, f"gpu{r}", f"gpu{index[tuple(nxt)]}", bandwidth, latency, link)
    return G

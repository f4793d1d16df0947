"""Compressed transports for QSGD payloads, whose sizes differ from rank to rank.

Quantized payloads carry their own per-bucket scales, so they cannot be summed on the wire by
a plain allreduce (QSGD paper, Section 5; CGX; GRACE's all_to_all mode). Two transports:

- ``qsgd_allgather``: every rank all-gathers every other rank's whole payload (a ring
  allgather in which block j has rank j's payload size), then each decodes and averages
  locally. Cost (p-1)(alpha + max_j C_j / B) on a ring, unchunked: each hop waits for the block it
  forwards, so the largest payload paces every step ((p-1)(alpha + C / B) for equal payloads
  C; see emulator.closed_form).
- ``qsgd_scatter_reduce_allgather``: rank i sends the compressed chunk j of its gradient to
  owner j (all-to-all), the owner decodes, sums and re-quantizes its chunk, then the owners'
  re-quantized chunks are all-gathered around the ring (as ``qsgd.hook`` does).

``payload_bytes`` comes from the caller: measured sizes from a PayloadTrace, or
``qsgd.payload_nbytes`` for the packed codec.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ._builder import Builder
from ._schedule import split
from .direct import _pairs
from .ring import ring_pass


def _payloads(payload_bytes, p: int, name: str) -> np.ndarray:
    if payload_bytes is None:
        raise ConfigError(f"{name}: payload_bytes is required (one compressed size in bytes per "
                          f"rank), got None")
    sizes = np.atleast_1d(np.asarray(payload_bytes))
    if sizes.size == 1 and p > 1:
        sizes = np.full(p, int(sizes[0]))
    if len(sizes) != p:
        raise ConfigError(f"{name}: payload_bytes has {len(sizes)} entries, expected one per rank "
                          f"({p})")
    if not np.issubdtype(sizes.dtype, np.number) or np.any(sizes < 0) or \
            np.any(sizes != np.floor(sizes)):
        raise ConfigError(f"{name}: payload_bytes={sizes.tolist()} must be integers >= 0")
    return sizes.astype(np.int64)


def qsgd_allgather(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """Ring all-gather of per-rank payloads (``payload_bytes[j]`` bytes from rank j)."""
    p = len(ranks)
    sizes = _payloads(payload_bytes, p, "qsgd_allgather")
    b = Builder()
    if p >= 2:
        blocks = np.stack([split(s, chunks) for s in sizes])
        ring_pass(b, ranks, blocks, p - 1, 0, "allgather")
    return b.build(ranks, "allreduce", "qsgd_allgather", nbytes, chunks)


def qsgd_scatter_reduce_allgather(ranks, nbytes, *, chunks=1, graph=None, payload_bytes=None):
    """All-to-all of compressed chunks to their owners, decode+sum+requantize, ring all-gather.

    ``payload_bytes[j]`` is the compressed size in bytes of chunk j (1/p of the vector), both as
    sent to its owner and as re-quantized by it.
    """
    p = len(ranks)
    sizes = _payloads(payload_bytes, p, "qsgd_scatter_reduce_allgather")
    b = Builder()
    if p >= 2:
        order = np.asarray(ranks, dtype=np.int64)
        s, d = _pairs(p)
        scatter = b.add(order[s], order[d], sizes[d], (), "scatter")
        # Owner j re-quantizes once every peer's chunk j has arrived: one batch of p local
        # steps whose k-th dependency is the k-th chunk sent to it (p calls of p - 1 columns
        # each cost 10 s of numpy broadcasting at 1024 ranks).
        inbound = scatter[np.argsort(d, kind="stable")].reshape(p, p - 1)
        done = b.local(order, list(inbound.T), "reduce")
        blocks = np.stack([split(x, chunks) for x in sizes])
        ring_pass(b, ranks, blocks, p - 1, 0, "allgather", first_deps=[done])
    return b.build(ranks, "allreduce", "qsgd_scatter_reduce_allgather", nbytes, chunks)

"""PyTorch DDP's assignment of parameters to gradient buckets, reproduced without a process group.

DDP (``torch/nn/parallel/distributed.py``, ``_ddp_init_helper``; the C++
``compute_bucket_assignment_by_size`` in ``torch/csrc/distributed/c10d/reducer.cpp``) walks the
parameters in an order and closes a bucket as soon as its size *reaches* the current limit (so a
bucket may exceed it by its last tensor). The limits are ``[first_bucket_bytes, bucket_cap_bytes]``:
the first bucket closed is capped at ``first_bucket_bytes`` (1 MiB,
``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), every later one at ``bucket_cap_bytes``
(25 MiB). Tensors of different dtype or device never share a bucket.

Which order, and when, depends on ``find_unused_parameters``:

- ``False`` (DDP's default): the first iteration runs with a single bucket; after it DDP *rebuilds*
  the buckets, walking the parameters in the order their gradients became ready. Bucket 0, capped
  at 1 MiB, holds the first gradients of backward. This assignment is then kept for good.
  :func:`ddp_buckets` reproduces it from ``ready_order`` (as :func:`qsgd.measure` records it), or,
  without one, from reverse registration order (the order backward produces gradients in a
  network whose forward uses its layers in the order they are defined).
- ``True``: DDP builds the buckets once, at construction, from registration order (so the bucket
  capped at 1 MiB holds the *first-registered* parameters), reverses the list of buckets so that
  bucket 0 holds the last layers, and never rebuilds them.

Within a bucket, gradients lie in the order of the walk: that is the layout of DDP's flat bucket
buffer (``GradBucket.buffer()``), and the layout :func:`qsgd.measure` encodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from qsgd.errors import ConfigError
from ._checks import is_int

#: DDP's defaults: ``bucket_cap_mb=25`` (MiB) and ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``.
DEFAULT_BUCKET_CAP_BYTES = 25 * 2**20
DEFAULT_FIRST_BUCKET_BYTES = 2**20
#: the paper's rule: tensors with fewer elements are sent unquantized (Section 5).
DEFAULT_MIN_NUMEL = 10_000


@dataclass(frozen=True)
class BucketSpec:
    """One gradient bucket.

    Parameters
    ----------
    index : int
        Position in reduction order (bucket 0 is reduced first).
    names : tuple of str
        Parameter names, in the bucket buffer's order.
    numels : tuple of int
        Elements of each parameter.
    element_size : int
        Bytes per element (4 for fp32).
    dtype : str
        The parameters' dtype, e.g. ``"torch.float32"``.
    """

    index: int
    names: tuple[str, ...]
    numels: tuple[int, ...]
    element_size: int = 4
    dtype: str = "torch.float32"

    def __post_init__(self) -> None:
        if len(self.names) != len(self.numels) or not self.names:
            raise ConfigError(f"names and numels must be non-empty and of equal length, got "
                              f"{len(self.names)} names and {len(self.numels)} numels")

    @property
    def numel(self) -> int:
        """Elements in the bucket."""
        return sum(self.numels)

    @property
    def nbytes(self) -> int:
        """Bytes of the bucket buffer."""
        return self.numel * self.element_size

    def compressed_names(self, min_numel: int = DEFAULT_MIN_NUMEL) -> tuple[str, ...]:
        """Parameters with at least ``min_numel`` elements: quantized as one QSGD payload."""
        return tuple(n for n, k in zip(self.names, self.numels) if k >= min_numel)

    def raw_names(self, min_numel: int = DEFAULT_MIN_NUMEL) -> tuple[str, ...]:
        """Parameters with fewer than ``min_numel`` elements: sent uncompressed."""
        return tuple(n for n, k in zip(self.names, self.numels) if k < min_numel)

    def split(self, min_numel: int = DEFAULT_MIN_NUMEL) -> tuple[int, int]:
        """``(compressed_numel, raw_numel)`` under the paper's rule with threshold ``min_numel``."""
        comp = sum(k for k in self.numels if k >= min_numel)
        return comp, self.numel - comp


def _check_bytes(name: str, value) -> int:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{name} must be an int number of bytes >= 1, got {value!r}")
    return value


def ddp_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The parameters DDP reduces, in registration order: trainable, shared ones once."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _assign(params: Sequence[tuple[str, torch.Tensor]], limits: Sequence[int]) -> list[list[int]]:
    """DDP's greedy walk (``compute_bucket_assignment_by_size``): positions in ``params`` per bucket.

    One accumulator per (dtype, device); a bucket closes once its bytes reach the limit, and
    each (dtype, device) then moves on to the next limit (the last one repeats). Buckets left
    open at the end follow in the order of their first tensor.
    """
    open_: dict[tuple, list[int]] = {}
    size: dict[tuple, int] = {}
    level: dict[tuple, int] = {}
    closed: list[list[int]] = []
    for pos, (_, p) in enumerate(params):
        key = (p.dtype, p.device)
        open_.setdefault(key, []).append(pos)
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        lvl = level.setdefault(key, 0)
        if size[key] >= limits[lvl]:
            closed.append(open_.pop(key))
            size[key] = 0
            level[key] = min(lvl + 1, len(limits) - 1)
    closed.extend(sorted(open_.values(), key=lambda b: b[0]))
    return closed


def ddp_buckets(model: nn.Module, bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES, *,
                ready_order: Sequence[str] | None = None,
                find_unused_parameters: bool = False) -> list[BucketSpec]:
    """The gradient buckets DDP uses for ``model``, in reduction order.

    Parameters
    ----------
    model : torch.nn.Module
        The model (as passed to ``DistributedDataParallel``).
    bucket_cap_bytes : int
        Cap of every bucket but the first (DDP's ``bucket_cap_mb * 2**20``), bytes.
    first_bucket_bytes : int
        Cap of the first bucket closed, bytes. DDP uses 1 MiB only when ``bucket_cap_mb`` is left
        at its default; with an explicit ``bucket_cap_mb`` it uses the same cap for all.
    ready_order : sequence of str, optional
        Parameter names in the order their gradients became ready in backward (the order DDP
        rebuilds its buckets in). Default: reverse registration order.
    find_unused_parameters : bool
        Reproduce DDP's construction-time assignment, which it keeps when
        ``find_unused_parameters=True``, instead of the rebuilt one (see the module docstring).

    Returns
    -------
    list of BucketSpec
        Bucket ``i`` is the ``i``-th DDP reduces (``GradBucket.index() == i``).

    Examples
    --------
    The MLP's 235,146 fp32 gradients in 200 KB buckets after a 100 KB first one, filled in
    reverse registration order (a bucket closes once it is over its cap):

    >>> import qsgd
    >>> buckets = qsgd.ddp_buckets(qsgd.build_model("mlp"), bucket_cap_bytes=200_000,
    ...                            first_bucket_bytes=100_000)
    >>> [b.numel for b in buckets], sum(b.numel for b in buckets)
    ([34186, 200960], 235146)
    """
    _check_bytes("bucket_cap_bytes", bucket_cap_bytes)
    _check_bytes("first_bucket_bytes", first_bucket_bytes)
    params = ddp_parameters(model)
    if not params:
        raise ConfigError(f"model {type(model).__name__} has no trainable parameters to bucket")
    # DDP passes [first, cap] only when the first cap is the smaller one.
    limits = [first_bucket_bytes, bucket_cap_bytes] if first_bucket_bytes < bucket_cap_bytes else [bucket_cap_bytes]
    if find_unused_parameters:
        if ready_order is not None:
            raise ConfigError("ready_order is not used by DDP's construction-time assignment "
                              "(find_unused_parameters=True); pass one or the other")
        walk = params
        groups = list(reversed(_assign(walk, limits)))
    else:
        by_name = dict(params)
        if ready_order is None:
            walk = list(reversed(params))
        else:
            names = list(ready_order)
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise ConfigError(f"ready_order names parameters the model does not train: {unknown[:5]!r}")
            if len(set(names)) != len(names):
                raise ConfigError("ready_order lists a parameter twice")
            # Parameters whose gradient never became ready go last, as DDP's rebuild leaves them.
            listed = set(names)
            missing = [n for n, _ in reversed(params) if n not in listed]
            walk = [(n, by_name[n]) for n in (*names, *missing)]
        groups = _assign(walk, limits)
    buckets = []
    for i, group in enumerate(groups):
        first = walk[group[0]][1]
        buckets.append(BucketSpec(index=i, names=tuple(walk[j][0] for j in group),
                                  numels=tuple(walk[j][1].numel() for j in group),
                                  element_size=first.element_size(), dtype=str(first.dtype)))
    return buckets

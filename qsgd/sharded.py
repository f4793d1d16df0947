"""QSGD on the collectives of sharded data parallel, in real runs: PyTorch FSDP2 with QSDP's comms.

:func:`shard_model` wraps a model with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``)
unit by unit (:func:`qsgd.units_of`: one unit per block, the rest the root), as the strategy
of :data:`qsgd.STRATEGIES` asks (``reshard_after_forward`` for ``FULL_SHARD``; a 2-D device
mesh for HSDP), and replaces the units' collectives by QSGD's (Markov et al., QSDP, NeurIPS
2023), executing :func:`qsgd.shard_plan`'s steps:

- :class:`QSGDReduceScatter`, the quantized reduce-scatter of gradients (the first half of
  the DDP hook's scatter-reduce-allgather): each rank quantizes the ``p`` chunks of a unit's
  flat gradient, sends chunk ``j`` to rank ``j`` (one ``all_to_all_single`` of equal-size
  packed payloads), and decodes and sums (or averages, as FSDP asks) the ``p`` payloads of its
  own chunk, in rank order;
- :class:`QSGDAllGather`, the quantized parameter all-gather: each rank quantizes its shard,
  the payloads are all-gathered and every rank decodes all ``p`` into the unsharded
  parameters. The backward gather of a ``FULL_SHARD`` unit resends the forward's payload when
  the shard has not changed, so forward and backward see the same weights.

Every rank decodes the same payloads in the same order, so the gathered weights are identical
on every rank (a replica group of HSDP quantizes its identical shards with identical streams:
the streams are ``(seed, rank in the shard group, call, unit)``). The master shards stay in
full precision and the optimizer updates them; only what crosses the wire is quantized. Each
comm keeps the statistics of its calls (:class:`CommStats`): payload and dense bytes, and the
measured relative quantization error ``||Q(x) - x||^2 / ||x||^2`` of the data it can see (its
own shard; its own chunk's payload to itself), as the DDP transports' variance records.

ZeRO-1 keeps DDP's replicated parameters: :func:`zero1_optimizer` shards the optimizer state
(``torch.distributed.optim.ZeroRedundancyOptimizer``) of a DDP model, whose gradients any DDP
hook reduces (:func:`qsgd.qsgd_hook`). ZeRO-2 and ZeRO-3 run as FSDP2 without and with
resharding after forward: the same collectives, parameters sharded between steps.

Packed payloads only: their sizes are known to every rank (:func:`qsgd.payload_nbytes`), so
the payloads of a collective are all the same size and no sizes travel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from qsgd.codec import decode, encode
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError
from qsgd.shardplan import STRATEGIES, units_of

__all__ = ["shard_model", "Sharded", "QSGDAllGather", "QSGDReduceScatter", "CommStats",
           "zero1_optimizer", "REAL_STRATEGIES"]

#: strategies :func:`shard_model` runs with FSDP2: -> reshard_after_forward
REAL_STRATEGIES = {"fsdp": True, "zero3": True, "hsdp": True, "fsdp_grad_op": False,
                   "zero2": False}


@dataclass
class CommStats:
    """What one unit's comm did: ``calls``, ``payload_bytes`` handed to the process group,
    ``dense_bytes`` the dense collective would have handed it, ``error_sq`` and ``norm_sq``
    summed over what the rank could check (their ratio is the measured variance ratio)."""

    calls: int = 0
    payload_bytes: int = 0
    dense_bytes: int = 0
    error_sq: float = 0.0
    norm_sq: float = 0.0
    resent: int = 0

    @property
    def variance_ratio(self) -> float | None:
        return None if self.norm_sq == 0 else self.error_sq / self.norm_sq

    def _note(self, quantized: torch.Tensor, exact: torch.Tensor) -> None:
        d = (quantized.float() - exact.float())
        self.error_sq += float(d.square().sum())
        self.norm_sq += float(exact.float().square().sum())


class _Comm:
    """FSDP2's ``Comm`` protocol: the buffers FSDP asks for, plain tensors."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)


def _check(cfg: QSGDConfig, what: str) -> QSGDConfig:
    if not isinstance(cfg, QSGDConfig):
        raise ConfigError(f"{what}: expected a QSGDConfig, got {cfg!r}")
    if cfg.codec != "packed":
        raise ConfigError(f"{what}.codec: sharded collectives need equal payload sizes on every "
                          f"rank, the 'packed' codec; got {cfg.codec!r}")
    return cfg


class QSGDAllGather(_Comm):
    """The quantized parameter all-gather of one unit (``fsdp_module.set_custom_all_gather``).

    Parameters
    ----------
    config : QSGDConfig
        Packed codec.
    seed : int
    unit : int
        The unit's index (its quantization streams).
    """

    def __init__(self, config: QSGDConfig, *, seed: int = 0, unit: int = 0):
        self.config, self.seed, self.unit = _check(config, "weights"), seed, unit
        self.stats = CommStats()
        self._last: tuple | None = None

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group,
                 async_op: bool = False):
        if not input_tensor.is_floating_point():
            # FSDP packs parameters of mixed dtypes as bytes: those travel as they are
            return dist.all_gather_single(output_tensor, input_tensor, group=group,
                                               async_op=async_op)
        p, rank = group.size(), group.rank()
        n = input_tensor.numel()
        if self._last is not None and torch.equal(self._last[0], input_tensor):
            payload = self._last[1]          # backward's gather of an unchanged shard
            self.stats.resent += 1
        else:
            payload = encode(input_tensor, self.config, self.seed, rank=rank,
                             step=self.stats.calls, bucket=self.unit)
            self._last = (input_tensor.clone(), payload)
        self.stats.calls += 1
        size = payload.numel()
        gathered = torch.empty(p * size, dtype=torch.uint8, device=payload.device)
        dist.all_gather_single(gathered, payload, group=group)
        parts = [decode(gathered[j * size:(j + 1) * size]) for j in range(p)]
        # FSDP's input is the rank's slot of the output buffer: check it before overwriting
        self.stats._note(parts[rank], input_tensor)
        out = output_tensor.view(p, n)
        for j in range(p):
            out[j].copy_(parts[j].to(out.dtype))
        self.stats.payload_bytes += size
        self.stats.dense_bytes += n * input_tensor.element_size()
        return None


class QSGDReduceScatter(_Comm):
    """The quantized reduce-scatter of one unit's gradients
    (``fsdp_module.set_custom_reduce_scatter``); see the module docstring."""

    def __init__(self, config: QSGDConfig, *, seed: int = 0, unit: int = 0):
        self.config, self.seed, self.unit = _check(config, "grads"), seed, unit
        self.stats = CommStats()

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op,
                 async_op: bool = False):
        p, rank = group.size(), group.rank()
        s = output_tensor.numel()
        if input_tensor.numel() != p * s:
            raise ConfigError(f"reduce_scatter: input of {input_tensor.numel()} elements is not "
                              f"{p} chunks of {s}")
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ConfigError(f"reduce_scatter: op {op!r} is not SUM or AVG, which the quantized "
                              f"reduce-scatter does")
        chunks = input_tensor.view(p, s)
        # a stream per (rank, call, unit, chunk): the bucket counter spans the unit's chunks
        payloads = [encode(chunks[j], self.config, self.seed, rank=rank, step=self.stats.calls,
                           bucket=self.unit * p + j) for j in range(p)]
        size = payloads[0].numel()
        send = torch.cat(payloads)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        total = torch.zeros(s, dtype=torch.float32, device=output_tensor.device)
        for i in range(p):            # in rank order: the same sum on every run
            part = decode(recv[i * size:(i + 1) * size])
            if i == rank:
                self.stats._note(part, chunks[rank])
            total += part.float()
        if op == dist.ReduceOp.AVG:
            total /= p
        output_tensor.copy_(total.to(output_tensor.dtype))
        self.stats.calls += 1
        self.stats.payload_bytes += send.numel()
        self.stats.dense_bytes += input_tensor.numel() * input_tensor.element_size()
        return None


@dataclass
class Sharded:
    """A model under :func:`shard_model`: the FSDP2 ``module`` and its units' comms."""

    module: torch.nn.Module
    strategy: str
    units: tuple
    gathers: dict = field(default_factory=dict)
    reductions: dict = field(default_factory=dict)

    def stats(self) -> dict:
        """Per kind (``"weights"``, ``"grads"``): calls, bytes and the measured variance ratio
        summed over the units."""
        out = {}
        for kind, comms in (("weights", self.gathers), ("grads", self.reductions)):
            total = CommStats()
            for c in comms.values():
                for name in ("calls", "payload_bytes", "dense_bytes", "error_sq", "norm_sq", "resent"):
                    setattr(total, name, getattr(total, name) + getattr(c.stats, name))
            out[kind] = {"calls": total.calls, "payload_bytes": total.payload_bytes,
                         "dense_bytes": total.dense_bytes, "resent": total.resent,
                         "variance_ratio": total.variance_ratio}
        return out


def shard_model(model: torch.nn.Module, strategy: str = "fsdp", *,
                grads: QSGDConfig | None = None, weights: QSGDConfig | None = None,
                seed: int = 0, shard_size: int | None = None) -> Sharded:
    """Shard ``model`` (in place) under ``strategy`` with FSDP2, QSGD on its collectives.

    Call inside an initialised process group, on every rank, with identically initialised
    models.

    Parameters
    ----------
    model : torch.nn.Module
    strategy : str
        One of :data:`REAL_STRATEGIES` (``fsdp``, ``fsdp_grad_op``, ``hsdp``, ``zero2``,
        ``zero3``); ``zero1`` is :func:`zero1_optimizer` on a DDP model.
    grads, weights : QSGDConfig, optional
        Quantize the gradient reduce-scatters, the parameter all-gathers (packed codec).
    seed : int
        The quantization streams' seed.
    shard_size : int, optional
        HSDP's shard group (it must divide the world size; default: the world size).

    Returns
    -------
    Sharded

    Examples
    --------
    One rank (FSDP2 on a group of one sends nothing; ``tests/qsgd/test_sharded.py`` trains on
    four):

    >>> import torch, torch.distributed as dist, qsgd
    >>> from qsgd.sharded import shard_model
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> sharded = shard_model(model, "fsdp", grads=qsgd.QSGDConfig.from_bits(4))
    >>> [u.name for u in sharded.units], sorted(sharded.reductions)
    (['0', '2'], [0, 1])
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> dist.destroy_process_group()
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if strategy not in REAL_STRATEGIES:
        known = list(REAL_STRATEGIES)
        extra = " (zero1: qsgd.sharded.zero1_optimizer on a DDP model)" if strategy == "zero1" else ""
        raise ConfigError(f"strategy: {strategy!r} is not one of {known}{extra}")
    if grads is not None:
        _check(grads, "grads")
    if weights is not None:
        _check(weights, "weights")
    world = dist.get_world_size()
    device = next(model.parameters()).device
    kind = "cuda" if device.type == "cuda" else "cpu"
    if STRATEGIES[strategy].hybrid:
        g = world if shard_size is None else shard_size
        if not isinstance(g, int) or isinstance(g, bool) or g < 1 or world % g:
            raise ConfigError(f"shard_size: {g!r} does not divide the world size {world}")
        mesh = init_device_mesh(kind, (world // g, g), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(kind, (world,))
    reshard = REAL_STRATEGIES[strategy]
    units = units_of({n: p.numel() for n, p in model.named_parameters()})
    out = Sharded(model, strategy, units)
    modules = [(i, model.get_submodule(u.name)) for i, u in enumerate(units) if not u.root]
    for i, m in modules:
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    root = [(i, model) for i, u in enumerate(units) if u.root]
    for i, m in [*modules, *root]:
        if weights is not None:
            out.gathers[i] = QSGDAllGather(weights, seed=seed, unit=i)
            m.set_custom_all_gather(out.gathers[i])
        if grads is not None:
            out.reductions[i] = QSGDReduceScatter(grads, seed=seed, unit=i)
            m.set_custom_reduce_scatter(out.reductions[i])
    return out


def zero1_optimizer(params, optimizer_class=torch.optim.SGD, **kwargs):
    """ZeRO-1: each rank keeps and updates the optimizer state of its share of ``params``
    (PyTorch's ``ZeroRedundancyOptimizer``, which broadcasts the updated shares after the step),
    for a DDP model whose gradients its hook reduces."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **kwargs)

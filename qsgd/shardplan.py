"""Sharded data parallel as wire plans: per unit, the collectives of forward, backward and the step.

The one owner of how a sharded strategy uses the wire, as :mod:`qsgd.wireplan` is for a DDP
bucket. :func:`shard_plan` is a pure function of a strategy, the model's units, the world size
and the codecs; :mod:`qsgd.sharded` executes it in real runs (PyTorch FSDP2 with QSGD
collectives) and ``emulator.replay_sharded`` times it.

Strategies (:data:`STRATEGIES`), for ``p`` ranks sharding a unit of ``n`` elements into
shards of ``s = ceil(n / p)``:

``fsdp`` (PyTorch FSDP ``FULL_SHARD``; ZeRO stage 3)
    A unit's parameters live as shards. Before its forward they are all-gathered, freed after
    it, all-gathered again before its backward; once its gradients are ready they are
    reduce-scattered, each rank keeping its shard's (Zhao et al., "PyTorch FSDP", VLDB 2023,
    Section 3.2). The root unit (what no block holds: embeddings, final norm, head) is
    gathered first and kept until the end of backward (FSDP does not reshard the root after
    forward: ``torch/distributed/fsdp/_runtime_utils.py`` ``_post_forward_reshard``;
    FSDP2's ``fully_shard`` sets the root's ``reshard_after_forward`` to False).
``fsdp_grad_op`` (``SHARD_GRAD_OP``; ZeRO stage 2 with sharded parameters between steps)
    The parameters gathered for forward stay until the end of backward: no second gather.
``hsdp`` (``HYBRID_SHARD``)
    ``fsdp`` within a group of ``shard_size`` ranks (a machine), then an allreduce of each
    gradient shard across the ``p / shard_size`` groups (Zhao et al. 2023, Section 3.2.2).
``zero1``, ``zero2`` (DeepSpeed ZeRO stages 1 and 2; Rajbhandari et al., "ZeRO", SC 2020,
Section 5.1)
    Parameters replicated as in DDP; the optimizer state (stage 1) and the gradients
    (stage 2) sharded. Gradients leave in buckets as they become ready, allreduced (stage 1)
    or reduce-scattered (stage 2); each rank updates its shard and the updated shards are
    all-gathered after the step.
``zero3`` (DeepSpeed ZeRO stage 3)
    ``fsdp``'s collectives, reducing in the 16-bit parameter dtype (DeepSpeed's
    ``communication_data_type`` defaults to it) where FSDP reduces in the precision's gradient
    dtype (``MixedPrecision.reduce_dtype``; float32 in torchtitan's and Composer's defaults).
``ddp``
    Nothing sharded (:mod:`qsgd.wireplan`); listed for the memory model and the registry.

QSGD on the sharded collectives, as QSDP does (Markov et al., "Quantized Distributed Training
of Large Models with Convergence Guarantees", NeurIPS 2023):

- ``grads``: the quantized reduce-scatter, the first half of the scatter-reduce-allgather
  transport: every rank quantizes the ``p`` chunks of a unit's flat gradient (in backward's
  thread), sends chunk ``j`` to rank ``j`` (all_to_all), and the owner decodes the ``p``
  payloads of its chunk and averages them (beside backward).
- ``weights``: the quantized parameter all-gather: each owner quantizes its shard, the
  payloads are all-gathered and every rank decodes all ``p`` (beside compute).

A unit's flat shard is one payload: FSDP flattens a unit's parameters into one buffer and
QSDP quantizes the flat buffers, so DDP's rule of small tensors sent raw applies to the
bucketed gradients of ``zero1``/``zero2`` only.

Example
-------
>>> import qsgd
>>> units = qsgd.units_of({"embed.weight": 1000, "layers.0.w": 400, "layers.1.w": 400})
>>> [(u.name, u.numel, u.root) for u in units]
[('root', 1000, True), ('layers.0', 400, False), ('layers.1', 400, False)]
>>> plan = qsgd.shard_plan("fsdp", units, 4)
>>> [(c.name, c.op, c.nbytes) for c in plan.units[1].collectives]
[('parameter all_gather', 'allgather', 200), ('parameter all_gather', 'allgather', 200), ('gradient reduce_scatter', 'reduce_scatter', 1600)]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from qsgd.codec import payload_nbytes
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError
from qsgd.wireplan import BucketLayout, Collective, Stage, wire_bytes, wire_plan

__all__ = ["STRATEGIES", "Strategy", "Unit", "GroupCollective", "UnitPlan", "ShardPlan",
           "shard_plan", "units_of", "zero_buckets", "ZERO_BUCKET_NUMEL", "PHASES"]

#: Where a unit's steps run: before its forward, before its backward, once its gradients are
#: ready, after the optimizer step.
PHASES = ("forward", "backward", "reduce", "step")
#: Elements DeepSpeed ZeRO-1/2 reduce at a time (``reduce_bucket_size``) and gather after the
#: step (``allgather_bucket_size``), both 5e8 by default (DeepSpeed's configuration
#: documentation, "ZeRO optimizations").
ZERO_BUCKET_NUMEL = 500_000_000
#: the dtype a plan hands the process group for 2- and 4-byte elements
_DTYPES = {2: "bfloat16", 4: "float32"}


@dataclass(frozen=True)
class Strategy:
    """One sharded data-parallel strategy (see the module docstring).

    Parameters
    ----------
    name : str
        Key in :data:`STRATEGIES`.
    params_sharded : bool
        Parameters live as shards between steps (gathered per unit before use).
    reshard : bool
        Parameters freed after a unit's forward and gathered again before its backward.
    grads : {"allreduce", "reduce_scatter", "none"}
        How gradients are reduced (``"none"``: by DDP's own wire plans).
    optimizer_sharded : bool
        Each rank keeps and updates the optimizer state of its shard only.
    grads_sharded : bool
        Each rank keeps its shard's gradient only after the reduction.
    gather_after_step : bool
        The updated shards are all-gathered after the optimizer step (ZeRO-1/2).
    hybrid : bool
        Sharded within groups of ``shard_size`` ranks, replicated (allreduce) across them.
    per_unit : bool
        Collectives per FSDP unit (a transformer block); else per gradient bucket.
    reduce_dtype : {"grad", "param"}
        Reduce in the precision's gradient dtype or in the 16-bit parameter dtype.
    description, source : str
    """

    name: str
    params_sharded: bool
    reshard: bool
    grads: str
    optimizer_sharded: bool
    grads_sharded: bool
    gather_after_step: bool
    hybrid: bool
    per_unit: bool
    reduce_dtype: str
    description: str
    source: str

    @property
    def sharded(self) -> bool:
        """Whether anything is sharded (every strategy but ``ddp``)."""
        return self.optimizer_sharded


_FSDP = "Zhao et al., PyTorch FSDP, VLDB 2023, Section 3; torch/distributed/fsdp"
_ZERO = "Rajbhandari et al., ZeRO, SC 2020, Section 5; DeepSpeed runtime/zero"

#: The strategies a study, a real run and the memory model know.
STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp", False, False, "none", False, False, False, False, False, "grad",
             "DDP: everything replicated, gradients allreduced in buckets", "Li et al., VLDB 2020"),
    Strategy("zero1", False, False, "allreduce", True, False, True, False, False, "param",
             "ZeRO-1: optimizer state sharded; gradients allreduced, updated shards gathered",
             _ZERO),
    Strategy("zero2", False, False, "reduce_scatter", True, True, True, False, False, "param",
             "ZeRO-2: optimizer state and gradients sharded; gradients reduce-scattered",
             _ZERO),
    Strategy("zero3", True, True, "reduce_scatter", True, True, False, False, True, "param",
             "ZeRO-3: parameters sharded too, gathered per unit in forward and backward", _ZERO),
    Strategy("fsdp", True, True, "reduce_scatter", True, True, False, False, True, "grad",
             "FSDP FULL_SHARD: parameters gathered per unit in forward and again in backward",
             _FSDP),
    Strategy("fsdp_grad_op", True, False, "reduce_scatter", True, True, False, False, True, "grad",
             "FSDP SHARD_GRAD_OP: parameters gathered per unit in forward, kept for backward",
             _FSDP),
    Strategy("hsdp", True, True, "reduce_scatter", True, True, False, True, True, "grad",
             "FSDP HYBRID_SHARD: FULL_SHARD within a machine, gradient shards allreduced across",
             _FSDP),
)}


def strategy(name: str) -> Strategy:
    """The :class:`Strategy` called ``name``; ConfigError naming the ones there are."""
    if name not in STRATEGIES:
        raise ConfigError(f"parallelism: {name!r} is not one of {list(STRATEGIES)}")
    return STRATEGIES[name]


@dataclass(frozen=True)
class Unit:
    """What a strategy moves together: an FSDP unit (a block's parameters) or a gradient bucket.

    Parameters
    ----------
    name : str
    params : tuple of str
        Parameter names (``model.named_parameters()``).
    numel : int
        Elements.
    raw_numel : int
        Elements of tensors below QSGD's ``min_numel`` (sent raw by the DDP transports of
        ``zero1``; 0 for units).
    root : bool
        The root unit (kept gathered from forward to the end of backward).
    """

    name: str
    params: tuple
    numel: int
    raw_numel: int = 0
    root: bool = False

    def __post_init__(self):
        if not isinstance(self.numel, int) or isinstance(self.numel, bool) or self.numel < 1:
            raise ConfigError(f"unit {self.name!r}: numel must be an int >= 1, got {self.numel!r}")
        if not 0 <= self.raw_numel <= self.numel:
            raise ConfigError(f"unit {self.name!r}: raw_numel must be in [0, {self.numel}], "
                              f"got {self.raw_numel!r}")


def units_of(parameters: Mapping[str, int]) -> tuple[Unit, ...]:
    """FSDP's default units for a transformer: one per block, the rest one root unit.

    A block is the module at the first numbered name of a parameter (``layers.3`` of
    ``layers.3.attn.q.weight``: the element of a ``ModuleList``), as FSDP's
    ``ModuleWrapPolicy`` of the block class wraps each; what no block holds (embeddings,
    final norm, head) forms the root unit, first. A model without numbered modules is one
    root unit.

    >>> [u.name for u in units_of({"embed": 8, "blocks.0.w": 4, "blocks.1.w": 4, "norm": 2})]
    ['root', 'blocks.0', 'blocks.1']
    """
    groups: dict[str, list] = {}
    for name, n in parameters.items():
        parts = name.split(".")
        i = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        key = "root" if i is None else ".".join(parts[:i + 1])
        groups.setdefault(key, []).append((name, n))
    if not groups:
        raise ConfigError("parameters: a model needs at least one parameter to shard")
    root = groups.pop("root", [])
    out = [Unit("root", tuple(n for n, _ in root), sum(v for _, v in root), root=True)] if root else []
    return tuple(out + [Unit(k, tuple(n for n, _ in v), sum(x for _, x in v))
                        for k, v in groups.items()])


def zero_buckets(buckets: Sequence[tuple], cap: int = ZERO_BUCKET_NUMEL) -> tuple[Unit, ...]:
    """DeepSpeed ZeRO-1/2's gradient buckets from DDP's: consecutive ones (in the order their
    gradients become ready) joined until a bucket holds at least ``cap`` elements.

    ``buckets`` are ``(params, numel, raw_numel)`` in ready order.

    >>> [u.numel for u in zero_buckets([(("a",), 6, 0), (("b",), 6, 1), (("c",), 3, 0)], cap=10)]
    [12, 3]
    """
    out, cur = [], None
    for params, numel, raw in buckets:
        if cur is None:
            cur = [tuple(params), numel, raw]
        else:
            cur = [cur[0] + tuple(params), cur[1] + numel, cur[2] + raw]
        if cur[1] >= cap:
            out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return tuple(Unit(f"bucket {k}", p, n, r) for k, (p, n, r) in enumerate(out))


@dataclass(frozen=True)
class GroupCollective(Collective):
    """A plan :class:`~qsgd.wireplan.Collective` with the process group it runs on:
    ``"shard"`` (the ranks a unit is sharded over) or ``"replicate"`` (HSDP: one rank of
    each shard group, the ones holding the same shard)."""

    group: str = "shard"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "group": self.group}


@dataclass(frozen=True)
class UnitPlan:
    """One unit's steps in each phase (:data:`PHASES`), each an ordered tuple of
    :class:`GroupCollective` and :class:`~qsgd.wireplan.Stage` whose ``after`` indexes the
    same tuple (None: the phase's start)."""

    unit: Unit
    shard_numel: int
    forward: tuple = ()
    backward: tuple = ()
    reduce: tuple = ()
    step: tuple = ()

    @property
    def collectives(self) -> tuple:
        """Every collective of the unit in one iteration, in phase order."""
        return tuple(s for ph in PHASES for s in getattr(self, ph) if s.kind == "collective")

    @property
    def wire_bytes(self) -> int:
        return sum(c.wire_bytes for c in self.collectives)


@dataclass(frozen=True)
class ShardPlan:
    """The sharded plan of one model (see :func:`shard_plan`)."""

    strategy: Strategy
    world_size: int
    shard_size: int
    units: tuple
    gather_bytes: int
    reduce_bytes: int
    grads: QSGDConfig | None = None
    weights: QSGDConfig | None = None

    @property
    def replicas(self) -> int:
        """Groups holding the same shards (HSDP's machines; 1 otherwise)."""
        return self.world_size // self.shard_size

    @property
    def wire_bytes(self) -> int:
        """Bytes one rank sends to the others per iteration."""
        return sum(u.wire_bytes for u in self.units)

    def to_dict(self) -> dict:
        return {"strategy": self.strategy.name, "world_size": self.world_size,
                "shard_size": self.shard_size, "gather_bytes": self.gather_bytes,
                "reduce_bytes": self.reduce_bytes,
                "grads": None if self.grads is None else self.grads.to_dict(),
                "weights": None if self.weights is None else self.weights.to_dict(),
                "units": [{"name": u.unit.name, "numel": u.unit.numel, "root": u.unit.root,
                           **{ph: [s.to_dict() for s in getattr(u, ph)] for ph in PHASES}}
                          for u in self.units]}


# ---------------------------------------------------------------- steps
def _coll(name, op, dtype, nbytes, p, after, group="shard") -> GroupCollective:
    return GroupCollective(name, op, dtype, int(nbytes), wire_bytes(op, int(nbytes), p), after,
                           True, group)


def _gather(s: int, p: int, nbytes: int, weights: QSGDConfig | None) -> tuple:
    """All-gather ``p`` shards of ``s`` elements: dense at ``nbytes`` an element, or QSDP's
    quantized shards (encode the own shard, gather the payloads, decode all ``p``)."""
    if p == 1:
        return ()
    if weights is None:
        return (_coll("parameter all_gather", "allgather", _DTYPES[nbytes], nbytes * s, p, None),)
    return (Stage("encode", "callback", encode_numel=s),
            _coll("parameter all_gather", "allgather", "uint8", payload_nbytes(s, weights), p, 0),
            Stage("decode", "callback", decode_numel=p * s, payloads=p, after=1))


def _reduce_scatter(s: int, p: int, nbytes: int, grads: QSGDConfig | None) -> list:
    """Reduce-scatter a flat gradient of ``p`` chunks of ``s`` elements: dense, or quantized
    (encode the ``p`` chunks in backward's thread, all_to_all, the owner decodes ``p``
    payloads of its chunk and averages)."""
    if p == 1:
        return []
    if grads is None:
        return [_coll("gradient reduce_scatter", "reduce_scatter", _DTYPES[nbytes], nbytes * p * s,
                      p, None)]
    return [Stage("encode", "hook", encode_numel=p * s),
            _coll("chunk all_to_all", "alltoall", "uint8", p * payload_nbytes(s, grads), p, 0),
            Stage("reduce", "callback", decode_numel=p * s, payloads=p, after=1)]


def shard_plan(strategy_name: str, units: Sequence[Unit], world_size: int, *,
               shard_size: int | None = None, gather_bytes: int = 2, reduce_bytes: int = 4,
               grads: QSGDConfig | None = None, weights: QSGDConfig | None = None,
               transport: str = "fp32") -> ShardPlan:
    """The collectives and codec stages of every unit of a sharded step.

    Parameters
    ----------
    strategy_name : str
        A key of :data:`STRATEGIES` other than ``"ddp"``.
    units : sequence of Unit
        :func:`units_of` the model's parameters (``fsdp``, ``fsdp_grad_op``, ``hsdp``,
        ``zero3``), or :func:`zero_buckets` of its DDP buckets (``zero1``, ``zero2``).
    world_size : int
        Ranks training.
    shard_size : int, optional
        Ranks a unit is sharded over: HSDP's group (a machine; it must divide
        ``world_size``); the others shard over all ranks.
    gather_bytes, reduce_bytes : {2, 4}
        Bytes per element of the parameter all-gathers and of the gradient reduction.
    grads, weights : QSGDConfig, optional
        Quantize the gradient reduce-scatters, the parameter all-gathers (QSDP).
    transport : str
        ``zero1``'s gradient allreduce: a :func:`qsgd.wire_plan` transport (with ``grads``
        for the QSGD ones).

    Returns
    -------
    ShardPlan

    Examples
    --------
    HSDP on 2 machines of 4 GPUs, 4-bit gradients: the all_to_all inside a machine, then the
    shards' allreduce across the two:

    >>> import qsgd
    >>> units = qsgd.units_of({"layers.0.w": 4000})
    >>> plan = qsgd.shard_plan("hsdp", units, 8, shard_size=4, grads=qsgd.QSGDConfig.from_bits(4))
    >>> [(s.name, s.op, s.group) for s in plan.units[0].reduce if s.kind == "collective"]
    [('chunk all_to_all', 'alltoall', 'shard'), ('shard allreduce', 'allreduce', 'replicate')]
    """
    st = strategy(strategy_name)
    if st.name == "ddp":
        raise ConfigError("parallelism: 'ddp' has no sharded plan; its buckets follow "
                          "qsgd.wire_plan")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size: expected an int >= 1, got {world_size!r}")
    if shard_size is None or not st.hybrid:
        shard_size = world_size
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 \
            or world_size % shard_size:
        raise ConfigError(f"shard_size: {shard_size!r} does not divide world_size={world_size}; "
                          f"HSDP shards over groups of equal size (a machine's GPUs)")
    for name, v in (("gather_bytes", gather_bytes), ("reduce_bytes", reduce_bytes)):
        if v not in _DTYPES:
            raise ConfigError(f"{name}: expected 2 or 4 bytes per element, got {v!r}")
    for name, cfg in (("grads", grads), ("weights", weights)):
        if cfg is not None and not isinstance(cfg, QSGDConfig):
            raise ConfigError(f"{name}: expected a QSGDConfig or None, got {cfg!r}")
    if not units or not all(isinstance(u, Unit) for u in units):
        raise ConfigError(f"units: expected a non-empty sequence of Unit, got {units!r}")
    p, r = shard_size, world_size // shard_size
    plans = []
    for u in units:
        s = math.ceil(u.numel / p)
        if not st.per_unit:
            plans.append(_bucket_plan(st, u, world_size, gather_bytes, reduce_bytes, grads,
                                      weights, transport))
            continue
        gather = _gather(s, p, gather_bytes, weights)
        reduce = _reduce_scatter(s, p, reduce_bytes, grads)
        if st.hybrid and r > 1:
            reduce.append(_coll("shard allreduce", "allreduce", _DTYPES[reduce_bytes],
                                reduce_bytes * s, r, len(reduce) - 1 if reduce else None,
                                "replicate"))
        again = gather if st.reshard and not u.root else ()
        plans.append(UnitPlan(u, s, gather, again, tuple(reduce)))
    return ShardPlan(st, world_size, p, tuple(plans), gather_bytes, reduce_bytes, grads, weights)


def _bucket_plan(st: Strategy, u: Unit, p: int, gather_bytes: int, reduce_bytes: int,
                 grads, weights, transport: str) -> UnitPlan:
    """ZeRO-1/2: a gradient bucket reduced as it is ready, its updated shard gathered after
    the step."""
    s = math.ceil(u.numel / p)
    if st.grads == "allreduce":
        # ZeRO-1 reduces as DDP does: any DDP transport, QSGD's included
        layout = BucketLayout.of(u.numel - u.raw_numel, u.raw_numel, reduce_bytes)
        wire = "bf16" if transport == "fp32" and reduce_bytes == 2 else transport
        plan = wire_plan(wire, layout, p, grads if grads is not None and wire not in
                         ("fp32", "fp16", "bf16") else None)
        reduce = tuple(GroupCollective(c.name, c.op, c.dtype, c.nbytes, c.wire_bytes, c.after,
                                       c.exact) if c.kind == "collective" else c
                       for c in plan.steps)
    else:
        reduce = tuple(_reduce_scatter(s, p, reduce_bytes, grads))
    return UnitPlan(u, s, (), (), reduce, _gather(s, p, gather_bytes, weights))

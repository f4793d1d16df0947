"""Which data-parallel strategy to train with: the fastest that fits the GPU (:func:`recommend_strategy`).

For each strategy of :data:`qsgd.STRATEGIES` asked about, the memory one GPU needs
(:mod:`emulator.memory`) decides whether it can run at all; those that fit are replayed
(:func:`emulator.replay` for DDP, :func:`emulator.replay_sharded` for the others) with dense
gradients and with uniform QSGD widths: DDP and ZeRO-1 with the all-gather transport, the
strategies that reduce-scatter with QSGD's quantized reduce-scatter. Both quantize each rank's
gradient once, so a width's variance increase is the all-gather's of
:class:`emulator.VarianceModel` (the Budget applies to it, when the trace has variance
records; a ``bits_per_element`` budget caps the width). The pick is the fastest configuration
within the budget among the strategies that fit; ties go to the strategy listed first (the
registry's order, DDP first: the simplest).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from emulator.compute import ComputeModel, device as device_named
from emulator.compute.devices import memory_label
from emulator.errors import ConfigError
from emulator.network import Network

__all__ = ["StrategyOption", "StrategyChoice", "recommend_strategy", "BUDGET_KINDS", "budget_for",
           "recommend_parallelism"]


@dataclass(frozen=True)
class StrategyOption:
    """One (strategy, transport, width) and what it costs: ``iteration_s`` (None when it does
    not fit), ``memory_per_gpu`` (bytes), ``variance`` (the increase; None when unknown)."""

    strategy: str
    transport: str
    bits: int
    iteration_s: float | None
    memory_per_gpu: float
    fits: bool
    variance: float | None = None

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "transport": self.transport, "bits": self.bits,
                "iteration_s": self.iteration_s, "memory_per_gpu": self.memory_per_gpu,
                "fits": self.fits, "variance": self.variance}


@dataclass(frozen=True)
class StrategyChoice:
    """Every option evaluated and the one picked (``best``), at ``world_size`` GPUs."""

    best: StrategyOption
    options: tuple
    world_size: int
    device: str
    device_bytes: float
    notes: tuple = field(default=())

    @property
    def device_memory(self) -> str:
        """The GPU and its memory, for messages: ``"H100-SXM's 80 GiB (85.9 GB)"``."""
        return f"{self.device}'s {memory_label(self.device_bytes)}"

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict(), "world_size": self.world_size, "device": self.device,
                "device_bytes": self.device_bytes, "options": [o.to_dict() for o in self.options],
                "notes": list(self.notes)}


def recommend_strategy(trace, G, *, world_size: int | None = None, compute: ComputeModel,
                       strategies=None, bits=(8, 4), budget=None, network: Network | None = None,
                       shard_size: int | None = None) -> StrategyChoice:
    """The fastest strategy, transport and uniform width that fit the GPU (module docstring).

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        With operator records.
    G : networkx.Graph
    world_size : int, optional
        GPUs training (default all of ``G``).
    compute : ComputeModel
        Timed from the trace's operators (:meth:`ComputeModel.for_topology`).
    strategies : sequence of str, optional
        Keys of :data:`qsgd.STRATEGIES` (default all).
    bits : sequence of int
        Uniform QSGD widths to try (none: dense only).
    budget : emulator.Budget, optional
        Limits the QSGD options (module docstring).
    network : Network, optional
    shard_size : int, optional
        HSDP's shard group (default: a machine).

    Returns
    -------
    StrategyChoice

    Examples
    --------
    Llama 2 7B at 2 sequences of 4096 tokens per GPU on 16 H100: DDP, ZeRO-1 and
    SHARD_GRAD_OP (whole parameters between steps, or for all of backward) do not fit in
    80 GiB; ZeRO-2 (16-bit parameters, gradients sharded) and those that gather a block at a
    time do:

    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("llama2-7b", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> G = topologies.from_spec("cluster:dgx_h100x2")
    >>> m = emulator.ComputeModel.for_topology(G, trace, batch_size=2)
    >>> choice = emulator.recommend_strategy(trace, G, compute=m, bits=())
    >>> [o.strategy for o in choice.options if not o.fits]
    ['ddp', 'zero1', 'fsdp_grad_op']
    >>> choice.best.strategy in ("zero3", "fsdp", "hsdp")
    True
    """
    import qsgd

    from .memory import memory_per_gpu
    from .recommend import Budget, VarianceModel
    from .replaying import replay
    from .sharded import ShardNetworks, machine_size, replay_sharded

    names = tuple(qsgd.STRATEGIES) if strategies is None else tuple(strategies)
    for s in names:
        if s not in qsgd.STRATEGIES:
            raise ConfigError(f"strategies: {s!r} is not one of {list(qsgd.STRATEGIES)}")
    if not names:
        raise ConfigError("strategies must not be empty")
    if budget is not None and not isinstance(budget, Budget):
        raise ConfigError(f"budget must be an emulator.Budget, got {type(budget).__name__}")
    if compute.precision is None or compute.device in ("measured", "custom"):
        raise ConfigError("recommend_strategy needs a compute model timed from operator records "
                          "(ComputeModel.for_topology)")
    net = network if network is not None else Network(G, world_size)
    p = net.world_size
    dev = device_named(compute.device)
    batch = compute.batch_size or trace.batch_size
    vm = None
    if trace.has_variance:
        vm = VarianceModel(trace)
    notes, options = [], []
    g = shard_size or machine_size(net.G)
    for s in names:
        st = qsgd.STRATEGIES[s]
        shard = min(g, p) if st.hybrid else None
        if st.hybrid and p % shard:
            notes.append(f"{s}: a shard group of {shard} GPUs does not divide {p}; not evaluated")
            continue
        mem = memory_per_gpu(trace, s, p, precision=compute.precision, batch_size=batch,
                             shard_size=shard, device_bytes=dev.memory_bytes)
        qsgd_t = "qsgd_scatter_reduce_allgather" if st.grads == "reduce_scatter" else "qsgd_allgather"
        combos = [("fp32", 8 * compute.grad_bytes)] + [(qsgd_t, b) for b in bits]
        groups = ShardNetworks(net, shard or p) if s != "ddp" else None
        for transport, b in combos:
            var = None
            if transport != "fp32":
                var = None if vm is None or b not in vm.widths else \
                    vm.increase((b,) * trace.num_buckets, "qsgd_allgather", p)
                if budget is not None and ((budget.variance is not None and var is not None
                                            and var > budget.variance)
                                           or (budget.bits_per_element is not None
                                               and b > budget.bits_per_element)):
                    continue
            if not mem.fits:
                options.append(StrategyOption(s, transport, b, None, mem.total, False, var))
                continue
            qbits = None if transport == "fp32" else b
            if s == "ddp":
                pred = replay(trace, None, transport=transport, compute=compute, network=net,
                              bits=qbits)
            else:
                pred = replay_sharded(trace, None, parallelism=s, transport=transport, bits=qbits,
                                      compute=compute, network=net, shard_size=shard,
                                      networks=groups)
            options.append(StrategyOption(s, transport, b, pred.iteration_s, mem.total, True, var))
    run = [o for o in options if o.fits]
    if not run:
        least = min(options, key=lambda o: o.memory_per_gpu) if options else None
        need = "" if least is None else (f"; the least, {least.strategy}, needs "
                                         f"{least.memory_per_gpu / 1e9:.1f} GB")
        raise ConfigError(f"no strategy of {list(names)} fits {trace.model} at batch {batch} per GPU "
                          f"on {p} {dev.name} ({dev.memory_label}){need}")
    best = min(run, key=lambda o: (o.iteration_s, names.index(o.strategy)))
    return StrategyChoice(best, tuple(options), p, dev.name, dev.memory_bytes, tuple(notes))


#: The budgets people give (``qsgd-emu recommend``'s options, the dashboard's Recommend page):
#: an :class:`emulator.Budget` field, or ``variance_as_bits``: uniform B-bit QSGD's variance.
BUDGET_KINDS = ("variance_as_bits", "variance", "bits_per_element")


def budget_for(trace, world_size: int, kind: str, value, *, name: str | None = None):
    """The :class:`emulator.Budget` of ``kind`` (:data:`BUDGET_KINDS`) and ``value``:
    ``variance_as_bits`` B is the variance increase of uniform B-bit QSGD all-gather at
    ``world_size`` GPUs, from the trace's variance records at width B. ``name`` (default
    ``kind``) names the option in the one-line error.

    Examples
    --------
    >>> import emulator
    >>> emulator.budget_for(None, 64, "bits_per_element", 3.5)
    Budget(variance=None, bits_per_element=3.5)
    >>> emulator.budget_for(None, 64, "bits", 4)
    Traceback (most recent call last):
    ...
    emulator.errors.ConfigError: budget: 'bits' is not one of ['variance_as_bits', 'variance', 'bits_per_element']
    """
    from .recommend import Budget, VarianceModel

    if kind not in BUDGET_KINDS:
        raise ConfigError(f"budget: {kind!r} is not one of {list(BUDGET_KINDS)}")
    if kind != "variance_as_bits":
        return Budget(**{kind: value})
    vm = VarianceModel(trace)
    b = int(value)
    if b != value or b not in vm.widths:
        raise ConfigError(f"{name or kind} {value!r}: the trace has variance at bits {list(vm.widths)}")
    return Budget(variance=vm.increase((b,) * trace.num_buckets, "qsgd_allgather", world_size))


def recommend_parallelism(trace, G, *, world_size: int, compute: ComputeModel,
                          parallelism="auto", bits=None, budget=None,
                          budget_name: str | None = None) -> StrategyChoice:
    """:func:`recommend_strategy` as ``qsgd-emu recommend --parallelism`` and the dashboard's
    Recommend page ask for it.

    ``parallelism`` is ``"auto"`` (every strategy), comma-separated names or a sequence of
    them; ``bits`` the uniform widths (default 8 and 4); ``budget`` a ``(kind, value)`` of
    :func:`budget_for` or None (``budget_name`` names it in errors). A variance budget
    applies only where the trace has variance records (a trace recorded on the meta device
    has none): the choice's notes then say it was not applied. A bits-per-element budget
    always applies.

    Examples
    --------
    A small model recorded on the meta device (no variance records) on two DGX H100s:

    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> G = topologies.from_spec("cluster:dgx_h100x2")
    >>> m = emulator.ComputeModel.for_topology(G, trace, batch_size=32)
    >>> choice = emulator.recommend_parallelism(trace, G, world_size=16, compute=m,
    ...                                         parallelism="ddp,fsdp", budget=("variance", 0.1))
    >>> sorted({o.strategy for o in choice.options}), choice.notes[0]
    (['ddp', 'fsdp'], 'no variance budget applied: the trace has no variance records')
    """
    if isinstance(parallelism, str):
        names = None if parallelism.strip() == "auto" else \
            tuple(v.strip() for v in parallelism.split(",") if v.strip())
    else:
        names = tuple(parallelism)
    notes = ()
    if budget is not None and not trace.has_variance and budget[0] != "bits_per_element":
        budget, notes = None, ("no variance budget applied: the trace has no variance records",)
    limit = None if budget is None else budget_for(trace, world_size, *budget, name=budget_name)
    choice = recommend_strategy(trace, G, world_size=world_size, compute=compute,
                                strategies=names, bits=(8, 4) if bits is None else tuple(bits),
                                budget=limit)
    return replace(choice, notes=notes + choice.notes)

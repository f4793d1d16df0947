"""Replay one iteration of sharded data parallel (FSDP, HSDP, ZeRO-1/2/3) on a simulated cluster.

What each unit sends, when and on which process group is its :func:`qsgd.shard_plan` (the one
owner of how a sharded strategy uses the wire); where its compute sits in the step comes from
the trace's operators timed on the target GPU (:meth:`emulator.ComputeModel.unit_times`); this
module puts both on a rank's servers (:mod:`emulator.servers`) in the order the host issues the
work:

1. the **compute stream** runs forward, backward and the optimizer step as segments between
   the points where a unit's gathered parameters must be there (its first operator in forward;
   the start of its backward) and where its gradients are all ready (a reduction goes out,
   after a quantized reduce-scatter's encode, which runs right there and delays backward as
   the DDP hook's does); while a collective runs it goes at the share of the GPU's SMs the
   collective's kernel leaves (NCCL's thread blocks, one per channel:
   :meth:`ComputeModel.sm_share`, :func:`emulator.servers.run`'s ``paced`` server);
2. one **NCCL stream per process group** (the shard group; HSDP's replicate group is another
   communicator, so its allreduces overlap the shard group's collectives) runs the
   collectives one at a time in issue order. A unit's forward all-gather is issued once the
   unit two before it has computed (at most two units gathered: the one computing and the one
   prefetched, FSDP's ``limit_all_gathers`` and FSDP2's default prefetch); its backward
   all-gather at the start of the previous unit's backward (``BACKWARD_PRE`` prefetch); its
   reduce-scatter once its gradients are ready, after the all-gather issued before it;
3. the **stream beside compute** runs the codec's other stages one at a time: the owners'
   encode of their weight shards (once a step, before forward: the backward gather sends the
   same payloads), the decode of gathered payloads, the owner's decode and average of a
   reduced chunk. It runs on the compute's SMs: while both have work each goes at half its
   pace (processor sharing, the DDP replay's ``SHARE`` for its callback stages beside
   backward);
4. the **optimizer step** on each rank's shard once backward and every reduction are done;
   ZeRO-1/2 then all-gather the updated shards, which the next forward waits for.

ZeRO-1/2 keep DDP's replicated parameters: their units are gradient buckets (DDP's, joined to
DeepSpeed's ``reduce_bucket_size``, :func:`qsgd.zero_buckets`), ready where DDP's buckets are.
"""
from __future__ import annotations

import functools

from emulator.compute import ComputeModel
from emulator.compute.codec import CALL_KERNELS, codec_seconds
from emulator.compute.devices import device as device_named
from emulator.compute.rules import KERNEL_S
from emulator.errors import ConfigError
from emulator.network import Network

from . import servers
from .prediction import BucketTimeline, Prediction
from .replaying import SHARE, TRANSPORTS, _request

__all__ = ["replay_sharded", "sharded_plan", "ShardNetworks", "SHARDED_TRANSPORTS",
           "machine_size"]

#: Transports a strategy that reduce-scatters takes, and what each means there: dense
#: reductions in the precision's gradient dtype or in 16 bits, or QSGD's quantized
#: reduce-scatter (the first half of its scatter-reduce-allgather). ZeRO-1 allreduces and
#: takes every DDP transport.
SHARDED_TRANSPORTS = ("fp32", "fp16", "qsgd_scatter_reduce_allgather")


def machine_size(G) -> int:
    """GPUs of the machine holding rank 0 (the ``host`` its GPU nodes carry; one machine when
    they carry none): HSDP's default shard group.

    >>> import topologies
    >>> machine_size(topologies.from_spec("cluster:dgx_h100x2")), machine_size(topologies.from_spec("switch:4"))
    (8, 4)
    """
    import topologies

    gpus = topologies.gpus(G)
    host = G.nodes[gpus[0]].get("host")
    return len(gpus) if host is None else sum(1 for g in gpus if G.nodes[g].get("host") == host)


class ShardNetworks:
    """Seconds of a sharded plan's collectives on graph ``G``: the shard group's on ``net``
    (its ranks ``0..shard_size-1``: one machine for HSDP) and HSDP's replicate group (ranks
    ``0, g, 2g, ...``, one per machine) on the schedules NCCL's model builds for those ranks,
    each distinct one simulated once."""

    def __init__(self, net: Network, shard_size: int):
        self.net, self.shard_size = net, shard_size
        p = net.world_size
        self.shard = net if shard_size == p else Network(net.G, shard_size, net.algorithm)
        self.replicate_ranks = list(range(0, p, shard_size))
        self._cache: dict = {}

    def blocks(self, c) -> int:
        """Thread blocks the kernel of plan collective ``c`` occupies while it runs
        (:meth:`Network.blocks`), on its group's ranks."""
        if c.group == "shard":
            return self.shard.blocks(*_request(self.shard, c))
        return self.net.blocks(c.op, self.net.algorithm, int(c.nbytes), self.replicate_ranks)

    def seconds(self, c) -> tuple[float, float]:
        """``(seconds, bytes one GPU sends)`` of plan collective ``c``."""
        if c.group == "shard":
            return self.shard.collective(*_request(self.shard, c))
        if len(self.replicate_ranks) < 2 or c.nbytes == 0:
            return 0.0, 0.0
        key = (c.op, c.nbytes)
        if key not in self._cache:
            from emulator.collectives import build_schedule
            from emulator.engine import simulate

            sched = build_schedule(c.op, self.net.algorithm, self.replicate_ranks, int(c.nbytes),
                                   graph=self.net.G)
            self._cache[key] = (float(simulate(self.net.G, sched).time_s), float(c.wire_bytes))
        return self._cache[key]


@functools.lru_cache(maxsize=8)
def _units(trace):
    import qsgd

    ops = trace.operators
    if ops is None or not ops.parameters:
        raise ConfigError(f"trace of {trace.model!r} has no parameter sizes in its operator "
                          f"records: measure it again with this version (qsgd-emu measure)")
    return qsgd.units_of(ops.parameters)


def _ready_order(trace, ready: tuple) -> list:
    """The trace's DDP buckets as ``(params, numel, raw)`` in the order they are ready."""
    order = sorted(range(trace.num_buckets), key=lambda k: (ready[k], k))
    return [(trace.buckets[k].params, trace.buckets[k].numel, trace.buckets[k].raw_numel)
            for k in order], [ready[k] for k in order]


def sharded_plan(trace, strategy: str, world_size: int, compute: ComputeModel, *,
                 transport: str = "fp32", bits: int | None = None, weight_bits: int | None = None,
                 shard_size: int | None = None):
    """The :class:`qsgd.ShardPlan` a replay of ``trace`` follows on ``world_size`` GPUs.

    The parameters are gathered in the precision's 16-bit dtype (32 bits in fp32 and tf32);
    gradients are reduced in the compute model's gradient dtype (FSDP), in the 16-bit one
    (DeepSpeed), or in 16 bits for ``transport="fp16"``; a QSGD transport quantizes them at
    ``bits`` and, with ``weight_bits``, the parameter gathers.

    Examples
    --------
    >>> import emulator, qsgd
    >>> trace = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> m = emulator.ComputeModel.for_device("H100", trace, batch_size=8)
    >>> plan = emulator.sharded_plan(trace, "fsdp", 16, m)
    >>> [u.unit.name for u in plan.units][:3], plan.gather_bytes, plan.reduce_bytes
    (['root', 'blocks.0', 'blocks.1'], 2, 4)
    """
    import qsgd

    if strategy not in qsgd.STRATEGIES:
        raise ConfigError(f"parallelism: {strategy!r} is not one of {list(qsgd.STRATEGIES)}")
    st = qsgd.STRATEGIES[strategy]
    if st.name == "ddp":
        raise ConfigError("parallelism='ddp' replays with emulator.replay")
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    if st.grads == "reduce_scatter" and transport not in SHARDED_TRANSPORTS:
        raise ConfigError(f"transport {transport!r} does not reduce-scatter; with parallelism="
                          f"{strategy!r} use one of {list(SHARDED_TRANSPORTS)}")
    if compute.precision is None:
        raise ConfigError("a sharded replay needs a compute model timed from operator records "
                          "(ComputeModel.for_device or for_topology)")
    t = TRANSPORTS[transport]
    base = trace.config
    grads = weights = None
    if t.compressed:
        b = base.bits if bits is None else bits
        if not isinstance(b, int) or isinstance(b, bool) or not 2 <= b <= 16:
            raise ConfigError(f"bits must be an int in [2, 16] for a QSGD transport, got {bits!r}")
        grads = qsgd.QSGDConfig.from_bits(b, bucket_size=base.bucket_size, norm=base.norm,
                                          codec="packed")
        if weight_bits is not None:
            if not isinstance(weight_bits, int) or isinstance(weight_bits, bool) \
                    or not 2 <= weight_bits <= 16:
                raise ConfigError(f"weight_bits must be an int in [2, 16] or None, got "
                                  f"{weight_bits!r}")
            weights = qsgd.QSGDConfig.from_bits(weight_bits, bucket_size=base.bucket_size,
                                                codec="packed")
    low = 4 if compute.precision in ("fp32", "tf32") else 2
    reduce_bytes = 2 if transport == "fp16" else \
        (compute.grad_bytes if st.reduce_dtype == "grad" else low)
    if st.per_unit:
        units = _units(trace)
    else:
        _, _, _, ready = compute.phases(trace)
        buckets, _ = _ready_order(trace, ready)
        units = qsgd.zero_buckets(buckets)
    wire = t.wire if t.compressed else ("fp16" if transport == "fp16" else "fp32")
    return qsgd.shard_plan(st.name, units, world_size, shard_size=shard_size, gather_bytes=low,
                           reduce_bytes=reduce_bytes, grads=grads if st.grads else None,
                           weights=weights, transport=wire)


def _share(groups: ShardNetworks, step, compute: ComputeModel) -> float:
    """Share of the GPU's SMs collective ``step``'s kernel takes from compute while it runs
    (:meth:`ComputeModel.sm_share` of its thread blocks; 0 without a GPU)."""
    return compute.sm_share(groups.blocks(step)) if compute.sms else 0.0


def _stage_seconds(stage, cfg, compute: ComputeModel) -> float:
    """Seconds of one codec stage on the compute model's GPU (its ``codec_device``)."""
    if cfg is None or compute.codec_device is None:
        return 0.0
    dev = device_named(compute.codec_device)
    enc = codec_seconds("encode", stage.encode_numel, cfg.bits, dev, compute.codec_kind)
    dec = codec_seconds("decode", stage.decode_numel, cfg.bits, dev, compute.codec_kind)
    if stage.payloads > 1:
        dec += (stage.payloads - 1) * CALL_KERNELS["decode"] * KERNEL_S
    return (enc + dec) * compute.codec_scale


def replay_sharded(trace, G, *, parallelism: str = "fsdp", transport: str = "fp32",
                   bits: int | None = None, weight_bits: int | None = None,
                   compute: ComputeModel | None = None, world_size: int | None = None,
                   algorithm: str = "nccl", network: Network | None = None,
                   shard_size: int | None = None, networks: ShardNetworks | None = None
                   ) -> Prediction:
    """Predict one training iteration of ``trace``'s model under a sharded strategy.

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        With operator records (``qsgd.measure(..., device="meta")`` records a 70B layout).
    G : networkx.Graph
        Topology; ignored when ``network`` is given.
    parallelism : str
        A key of :data:`qsgd.STRATEGIES` other than ``"ddp"``.
    transport : str
        ``fp32`` (reductions in the precision's gradient dtype), ``fp16`` (in 16 bits) or
        ``qsgd_scatter_reduce_allgather`` (QSGD's quantized reduce-scatter); ZeRO-1 takes
        every key of :data:`emulator.TRANSPORTS`.
    bits : int, optional
        QSGD width of the gradients (default: the trace's).
    weight_bits : int, optional
        QSGD width of the parameter all-gathers in a QSGD row (QSDP); None: dense.
    compute : ComputeModel
        From the trace's operators (:meth:`ComputeModel.for_device`); required.
    world_size, algorithm, network
        As :func:`emulator.replay`.
    shard_size : int, optional
        HSDP's shard group (default: the GPUs of a machine, :func:`machine_size`).
    networks : ShardNetworks, optional
        Reused across calls (its caches).

    Returns
    -------
    Prediction
        ``buckets`` holds one timeline per unit (in the plan's order), its ``collectives``
        every gather and reduction of the unit.

    Examples
    --------
    GPT-2 under FSDP on two DGX H100 against DDP: each block is gathered twice in bf16 and
    reduce-scattered in fp32 where DDP all-reduces it in fp32 (as many bytes), the root unit
    (embeddings: a third of GPT-2) gathered once; hidden behind compute:

    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")
    >>> G = topologies.from_spec("cluster:dgx_h100x2")
    >>> m = emulator.ComputeModel.for_topology(G, trace, batch_size=8)
    >>> fsdp = emulator.replay_sharded(trace, G, parallelism="fsdp", compute=m)
    >>> ddp = emulator.replay(trace, G, compute=m)
    >>> round(fsdp.bytes_per_gpu / ddp.bytes_per_gpu, 2)
    0.92
    >>> fsdp.iteration_s < 1.2 * ddp.iteration_s, len(fsdp.buckets)
    (True, 13)
    """
    import qsgd

    if compute is None or not isinstance(compute, ComputeModel):
        raise ConfigError(f"compute must be a ComputeModel timed from operator records, got "
                          f"{compute!r}")
    if parallelism not in qsgd.STRATEGIES:
        raise ConfigError(f"parallelism: {parallelism!r} is not one of {list(qsgd.STRATEGIES)}")
    net = network if network is not None else Network(G, world_size, algorithm)
    p = net.world_size
    st = qsgd.STRATEGIES[parallelism]
    if st.hybrid:
        g = machine_size(net.G) if shard_size is None else shard_size
        if not isinstance(g, int) or isinstance(g, bool) or g < 1 or p % g:
            raise ConfigError(f"parallelism='hsdp': a shard group of {g!r} GPUs does not divide "
                              f"world_size={p}; use a world size that is a multiple of it")
        shard_size = min(g, p)
    plan = sharded_plan(trace, parallelism, p, compute, transport=transport, bits=bits,
                        weight_bits=weight_bits, shard_size=shard_size)
    groups = networks if networks is not None else ShardNetworks(net, plan.shard_size)
    if st.per_unit:
        times = compute.unit_times(trace, [u.unit.params for u in plan.units],
                                   shards=plan.shard_size)
        fwd, bwd, opt = times.forward_s, times.backward_s, times.optimizer_s
        issue = _unit_points(plan, times, st)
    else:
        fwd, bwd, _, ready = compute.phases(trace)
        opt = compute.unit_times(trace, [], shards=p).optimizer_s
        buckets, readies = _ready_order(trace, ready)
        issue = _bucket_points(plan, buckets, readies, fwd)
    return _replay(plan, issue, fwd, bwd, opt, groups, compute, net, transport, trace)


# ---------------------------------------------------------------- where each phase is issued
def _unit_points(plan, times, st) -> dict:
    """``{(unit, phase): (position, wait)}``: where in the step (compute seconds) each phase is
    issued and, for a gather, where compute waits for it (None: nothing waits)."""
    n = len(plan.units)
    fwd = times.forward_s
    forder = sorted(range(n), key=lambda i: (not plan.units[i].unit.root, times.forward_start[i], i))
    fpos = {i: (0.0 if plan.units[i].unit.root else times.forward_start[i]) for i in range(n)}
    out = {}
    for k, i in enumerate(forder):
        prev = forder[k - 1] if k >= 1 else None
        # issued once the unit two before has computed: when the one before starts
        out[i, "forward"] = (fpos[prev] if prev is not None and k >= 2 else 0.0, fpos[i])
    border = sorted((i for i in range(n) if not plan.units[i].unit.root),
                    key=lambda i: (times.backward_start[i], i))
    for k, i in enumerate(border):
        start = fwd + times.backward_start[i]
        prev = border[k - 1] if k >= 1 else i
        out[i, "backward"] = (fwd + times.backward_start[prev], start)
    for i in range(n):
        out[i, "reduce"] = (fwd + times.ready[i], None)
    return out


def _bucket_points(plan, buckets: list, readies: list, fwd: float) -> dict:
    """ZeRO-1/2: a bucket is reduced once the last DDP bucket joined into it is ready."""
    when = {name: r for (params, _, _), r in zip(buckets, readies) for name in params}
    return {(i, "reduce"): (fwd + max(when[n] for n in u.unit.params), None)
            for i, u in enumerate(plan.units)}


# ---------------------------------------------------------------- the servers' work
_KIND = {"forward": 0, "backward": 0, "reduce": 1, "step": 2}


def _replay(plan, issue: dict, fwd: float, bwd: float, opt: float, groups: ShardNetworks,
            compute: ComputeModel, net: Network, transport: str, trace) -> Prediction:
    n = len(plan.units)
    # compute points: where a gather is waited for or a phase is issued
    points = sorted({0.0, fwd, fwd + bwd} | {x for (pos, wait) in issue.values()
                                               for x in (pos, wait) if x is not None})
    seg_end = {points[j + 1]: ("compute", j) for j in range(len(points) - 1)}
    waits: dict = {}
    work = []          # (server, position, order, Item)
    stage_s = codec_s = sent = 0.0
    cfgs = {"forward": plan.weights, "backward": plan.weights, "step": plan.weights,
            "reduce": plan.grads}
    done_of: dict = {}   # (unit, phase) -> key of its last step
    colls: dict = {i: [] for i in range(n)}
    enc_weights = set()
    for (i, phase), (pos, wait) in sorted(issue.items(), key=lambda kv: (kv[1][0], _KIND[kv[0][1]], kv[0][0])):
        steps = getattr(plan.units[i], phase)
        if not steps:
            continue
        trigger = () if pos not in seg_end else (seg_end[pos],)
        order = (_KIND[phase], i)
        for j, step in enumerate(steps):
            key = (i, phase, j)
            after = trigger if step.after is None else ((i, phase, step.after),)
            if step.kind == "stage":
                if phase in ("forward", "backward", "step") and step.name == "encode":
                    # the owner quantizes its shard once a step; the backward gather resends it
                    if i in enc_weights:
                        work.append(("side", -1.0, (0, i, j), servers.Item(key, 0.0, ())))
                        continue
                    enc_weights.add(i)
                    after, spot = (), -1.0
                else:
                    spot = pos
                secs = _stage_seconds(step, cfgs[phase], compute)
                codec_s += secs
                where = "compute" if step.runs_in == "hook" else "side"
                work.append((where, spot, (*order, j, 0), servers.Item(key, secs, after)))
                continue
            secs, bytes_sent = groups.seconds(step)
            sent += bytes_sent
            work.append((step.group, pos, (*order, j),
                         servers.Item(key, secs, after, _share(groups, step, compute))))
            colls[i].append((key, f"{phase} {step.name}"))
        done_of[i, phase] = (i, phase, len(steps) - 1)
        if wait is not None:
            waits.setdefault(wait, []).append(done_of[i, phase])
    for j in range(len(points) - 1):
        work.append(("compute", points[j], (9, j), servers.Item(
            ("compute", j), points[j + 1] - points[j], tuple(waits.get(points[j], ())))))
    reduced = tuple(v for (i, ph), v in done_of.items() if ph == "reduce")
    last = (("compute", len(points) - 2),) if len(points) > 1 else ()   # no compute: none
    work.append(("compute", fwd + bwd, (10, 0), servers.Item("optimizer", opt, (*last, *reduced))))
    for i in range(n):
        for j, step in enumerate(plan.units[i].step):
            key = (i, "step", j)
            after = ("optimizer",) if step.after is None else ((i, "step", step.after),)
            if step.kind == "stage":
                secs = _stage_seconds(step, plan.weights, compute)
                codec_s += secs
                work.append(("side", fwd + bwd + opt, (11, i, j), servers.Item(key, secs, after)))
                continue
            secs, bytes_sent = groups.seconds(step)
            sent += bytes_sent
            work.append((step.group, fwd + bwd + opt, (11, i, j),
                         servers.Item(key, secs, after, _share(groups, step, compute))))
            colls[i].append((key, f"step {step.name}"))
    queues: dict = {}
    for server, pos, order, item in sorted(work, key=lambda w: (w[1], w[2])):
        queues.setdefault(server, []).append(item)
    times = servers.run(queues, paced="compute", beside="side", split=SHARE)
    iteration = max(end for _, end in times.values())
    compute_s = fwd + bwd + opt
    ready_at = {i: times[seg_end[issue[i, "reduce"][0]]][1] if issue[i, "reduce"][0] in seg_end
                else 0.0 for i in range(n)}
    timeline = []
    for i, u in enumerate(plan.units):
        cs = sorted(((name, *times[key]) for key, name in colls[i]), key=lambda c: c[1])
        ends = [times[k][1] for k in times if isinstance(k, tuple) and len(k) == 3 and k[0] == i]
        red = [times[(i, "reduce", j)] for j in range(len(u.reduce))]
        enc_end = max((e for (a, e), st in zip(red, u.reduce) if st.kind == "stage"
                       and st.runs_in == "hook"), default=ready_at[i])
        timeline.append(BucketTimeline(
            i, ready_at[i], ready_at[i], enc_end, max((c[2] for c in cs), default=enc_end),
            max(ends, default=ready_at[i]), sum(c.nbytes for c in u.collectives),
            sum(c[2] - c[1] for c in cs), u.unit.name, cs[0][1] if cs else enc_end, tuple(cs),
            min((c[1] for c in cs), default=enc_end)))
    st = plan.strategy
    what = (f"{st.name} ({st.description}) over {plan.shard_size} GPUs"
            + (f" x {plan.replicas} replicas" if plan.replicas > 1 else ""))
    codec = []
    if plan.grads is not None:
        codec.append(f"gradients quantized to {plan.grads.bits} bits")
    if plan.weights is not None:
        codec.append(f"parameter gathers quantized to {plan.weights.bits} bits (QSDP)")
    source = what + ("; " + ", ".join(codec) if codec else "; dense collectives") + \
        f"; gathers {8 * plan.gather_bytes}-bit, reductions {8 * plan.reduce_bytes}-bit"
    bits = plan.grads.bits if plan.grads is not None else 8 * plan.reduce_bytes
    return Prediction(
        iteration_s=iteration, compute_s=compute_s, exposed_comm_s=max(0.0, iteration - compute_s),
        encode_decode_s=codec_s, forward_s=fwd, backward_s=bwd, optimizer_s=opt,
        bytes_per_gpu=sent, transport=transport, bits=bits, world_size=net.world_size,
        algorithm=net.algorithm, topology=net.name, source=source, buckets=tuple(timeline),
        bucket_bits=(bits,) * n)

"""Replay one training iteration of a measured model over a simulated cluster (:func:`emulator.replay`).

Named ``replaying`` so that importing it does not shadow the public function ``emulator.replay``.

What each bucket sends, in what order, and which local work runs where, is the bucket's
:func:`qsgd.wire_plan` (the one owner of how the hook uses the wire); the replay only times it.
The model of an iteration (PyTorch DDP with an asynchronous communication hook, as
:func:`qsgd.qsgd_hook` and DDP's own allreduce run):

1. forward (``forward_s``);
2. backward; bucket ``k``'s gradients are ready ``ready_s[k]`` seconds into it (measured) and DDP
   hands the bucket to the hook then, in bucket order. The plan's ``"hook"`` stages (copy,
   quantize, encode) run right there, in backward's thread (on a GPU, its stream), so each
   delays the rest of backward by its duration;
3. one communication stream: collectives run one at a time, in plan order and buckets in order
   (NCCL runs a communicator's collectives on one stream, Li et al., "PyTorch Distributed",
   VLDB 2020, Section 3.2.3; the hook issues them in that order, see :mod:`qsgd.hook`); a
   collective starts once the step it waits for is done and the stream is free, and overlaps
   the rest of backward. A collective issued on the hook's entry (the scatter-reduce-allgather
   transport's small-tensor allreduce) runs under the encode;
4. the plan's ``"callback"`` stages (decode, average, re-encode) run once their collective is
   done, one at a time (the hook's callback thread), beside the next collectives on the
   stream. They run on the same compute resource as backward (a rank's cores; a GPU's SMs,
   which a decode kernel shares with backward's) and share it equally while backward's
   thread still runs: each goes at half its pace then (processor sharing; docs/collectives.md,
   "Work beside backward"). Unlike a stage that stops backward outright, this is continuous
   in when the stage starts: a collective ending a microsecond earlier or later moves the
   step by about as much, never by a whole decode;
5. the optimizer step once backward and every bucket are done.

Each collective's seconds come from :meth:`emulator.Network.collective` (simulated on the graph,
cached per size, since buckets of equal size repeat). Where collectives need the host's CPU and
ranks share cores (gloo on CPU hosts: its threads copy, reduce and push the bytes through the
kernel), a collective that overlaps compute takes far longer than alone; given ``loaded`` (links
fitted to collectives measured while every rank computed), a collective progresses at that
network's pace while its rank computes (backward, a callback stage) and at the idle pace
otherwise: a fluid model, each second doing 1/T of the work for the T of the current state.
The other side of that interference, collectives slowing the compute, is ``compute_pace``: the
rank's compute (backward's thread and the callback stages alike) goes at that pace while a
collective runs (measured by the harness as the compute-alone step's time with and without a
collective running all the while). On a GPU the compute model gives it instead, collective by
collective: NCCL's kernel holds one SM per channel while it runs (:meth:`Network.blocks`), and
the compute goes at the share of the SMs left (:func:`gpu_pace`). :mod:`emulator.overlap`
times the three servers (backward's
thread, the callback thread, the stream) event by event. Stage seconds scale the trace's
measured encode and decode seconds per element (``decode_s`` is one payload's; an allgather
rank decodes ``p`` of them).
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.compute import ComputeModel
from emulator.compute.methods import stage_seconds
from emulator.errors import ConfigError
from emulator.network import DEFAULT_ALGORITHM, Network

from . import overlap
from ._checks import is_int
from .overlap import Work
from .prediction import BucketTimeline, Prediction


#: Each one's share of a rank's compute while a callback stage runs beside backward's thread
#: (processor sharing between the two; module docstring, item 4).
SHARE = 0.5


# ---------------------------------------------------------------- transports
@dataclass(frozen=True)
class Transport:
    """How a bucket's gradient travels.

    Parameters
    ----------
    name : str
        Key in :data:`TRANSPORTS`.
    compressed : bool
        Whether the bucket is QSGD-encoded (encode/decode seconds count; raw small tensors
        travel uncompressed).
    bytes_per_element : int or None
        Wire bytes per element of an uncompressed allreduce (4 fp32, 2 fp16).
    wire : str
        The :func:`qsgd.wire_plan` transport the bucket follows.
    description : str
    method : str or None
        For compression as another project implements it (:mod:`qsgd.wiremethods`): the
        kind of config its plan takes (``"powersgd"``, ``"grace"``), given to :func:`replay`
        as ``method=`` (PowerSGD defaults to PyTorch's hook at rank 1); its stages are timed
        by :func:`emulator.compute.methods.stage_seconds` on the compute model's GPU.
    study : bool
        Whether a study may compare it (GRACE's compressors need each run's settings).
    """

    name: str
    compressed: bool
    bytes_per_element: int | None
    wire: str
    description: str
    method: str | None = None
    study: bool = True

    @property
    def bits(self) -> int | None:
        """The width a study row of a transport that is not QSGD carries (32 for fp32)."""
        return None if self.compressed else 8 * self.bytes_per_element


#: Transports a bucket can be sent with. ``fp32`` is DDP's own allreduce of the gradients as
#: they are: float32, or bfloat16 when the parameters are (the ``bf16`` precision, where the
#: compute model's ``grad_bytes`` is 2).
TRANSPORTS: dict[str, Transport] = {
    "fp32": Transport("fp32", False, 4, "fp32", "fp32 allreduce (DDP's default)"),
    "fp16": Transport("fp16", False, 2, "fp16", "fp16 allreduce (DDP's fp16_compress_hook)"),
    "qsgd_allgather": Transport(
        "qsgd_allgather", True, None, "allgather",
        "each rank all-gathers its QSGD payload, every rank decodes and sums all (the paper's scheme)"),
    "qsgd_scatter_reduce_allgather": Transport(
        "qsgd_scatter_reduce_allgather", True, None, "scatter_reduce_allgather",
        "ranks quantize the chunk each owner reduces, owners decode, sum, requantize, all-gather"),
    "powersgd": Transport(
        "powersgd", False, 4, "powersgd",
        "PowerSGD (PyTorch's DDP powerSGD_hook; rank 1 unless method= says): allreduces of "
        "rank-r factors P and Q, vectors uncompressed", method="powersgd"),
    "grace_allgather": Transport(
        "grace_allgather", False, 4, "grace_allgather",
        "a GRACE compressor (TensorFlow + Horovod) through its allgather communicator",
        method="grace", study=False),
    "grace_allreduce": Transport(
        "grace_allreduce", False, 4, "grace_allreduce",
        "a GRACE compressor (TensorFlow + Horovod) through its allreduce communicator",
        method="grace", study=False),
}
#: The transports a study compares unless told otherwise: the ones it always compared.
STUDY_DEFAULT = ("fp32", "fp16", "qsgd_allgather", "qsgd_scatter_reduce_allgather")

#: The emulator's algorithm for each plan op under each model (allreduce: the Network's own;
#: reduce_scatter: the sharded plans' gradient reduction, :mod:`qsgd.shardplan`).
_ALGORITHMS = {"nccl": {"allgather": "nccl", "alltoall": "nccl", "reduce_scatter": "nccl"},
               "textbook": {"allgather": "ring", "alltoall": "direct", "reduce_scatter": "ring"}}


# ---------------------------------------------------------------- per-bucket sizes
def _qsgd_config(trace, bits: int | None):
    """The QSGD config to replay at: the trace's, or the packed codec at ``bits``."""
    import qsgd

    cfg = trace.config
    if bits is None or bits == cfg.bits:
        return cfg, "measured payloads"
    if not is_int(bits) or not 2 <= bits <= 16:
        raise ConfigError(f"bits must be an int in [2, 16] for a QSGD transport, got {bits!r}")
    new = qsgd.QSGDConfig.from_bits(bits, bucket_size=cfg.bucket_size, norm=cfg.norm, codec="packed")
    return new, (f"packed payload sizes at {bits} bits (exact, qsgd.payload_nbytes); "
                 f"encode/decode scaled by bytes from {cfg.bits}-bit measurements")


def method_config(transport: str, method=None):
    """The config of method transport ``transport`` (:attr:`Transport.method`): ``method``
    checked, or the default (PowerSGD: PyTorch's hook at rank 1); None for the others."""
    import qsgd

    t = TRANSPORTS[transport]
    if t.method is None:
        if method is not None:
            raise ConfigError(f"method: transport {transport!r} takes no method config, got {method!r}")
        return None
    kind = {"powersgd": qsgd.PowerSGDConfig, "grace": qsgd.CompressorConfig}[t.method]
    if method is None:
        if t.method == "grace":
            raise ConfigError(f"method: transport {transport!r} needs a qsgd.CompressorConfig "
                              f"(which GRACE compressor, with its settings)")
        return kind()
    if not isinstance(method, kind):
        raise ConfigError(f"method: transport {transport!r} needs a {kind.__name__}, got {method!r}")
    return method


def _method_layout(trace, k: int, grad_bytes: int):
    """Bucket ``k``'s tensors with their shapes (the trace's ``shapes`` record)."""
    import math

    import qsgd

    b = trace.buckets[k]
    shapes = b.extra.get("shapes")
    if not isinstance(shapes, list) or len(shapes) != len(b.params):
        raise ConfigError(f"trace of {trace.model!r}: bucket {k} records no tensor shapes, which "
                          f"this transport needs; measure the model again (qsgd-emu measure)")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    numels = tuple(math.prod(s) for s in shapes)
    return qsgd.BucketLayout(numels, (False,) * len(numels), grad_bytes, shapes)


def bucket_plan(trace, k: int, transport: str, world_size: int, bits: int | None = None,
                grad_bytes: int = 4, method=None):
    """The :func:`qsgd.wire_plan` of ``trace``'s bucket ``k`` under replay transport ``transport``.

    Examples
    --------
    >>> import emulator, qsgd
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> plan = emulator.bucket_plan(trace, 0, "qsgd_allgather", 4)
    >>> [c.op for c in plan.collectives]
    ['allgather']
    """
    import qsgd

    if transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    t = TRANSPORTS[transport]
    if t.method is not None:
        return qsgd.wire_plan(t.wire, _method_layout(trace, k, grad_bytes), world_size,
                              method_config(transport, method))
    b = trace.buckets[k]
    layout = qsgd.BucketLayout.of(b.compressed_numel, b.raw_numel, grad_bytes)
    if not t.compressed:
        # DDP all-reduces the gradients in the parameters' dtype: bf16 ones as bf16
        wire = "bf16" if t.wire == "fp32" and grad_bytes == 2 else t.wire
        return qsgd.wire_plan(wire, layout, world_size)
    cfg, _ = _qsgd_config(trace, bits)
    payload = None if cfg.codec == "packed" else trace.mean_payload_bytes(k)
    return qsgd.wire_plan(t.wire, layout, world_size, cfg, payload_bytes=payload)


# ---------------------------------------------------------------- replay
def _request(net: Network, c) -> tuple[str, str, int]:
    """The ``(op, algorithm, bytes)`` of :meth:`Network.collective` for plan collective ``c``:
    as NCCL runs it (its channels, its p2p all-to-all) under NCCL's model, else the textbook
    ring and direct."""
    algorithm = _ALGORITHMS["nccl" if net.nccl else "textbook"].get(c.op, net.algorithm)
    if c.op == "allgather":
        # nccl-tests' convention: the emulator's allgather size is the gathered total
        return "allgather", algorithm, int(net.world_size * c.nbytes)
    return c.op, algorithm, int(c.nbytes)


def gpu_pace(net: Network, c, compute: ComputeModel) -> float | None:
    """The compute's pace while plan collective ``c`` runs on a GPU: what its kernel's thread
    blocks leave of the SMs (:meth:`ComputeModel.sm_share`, the pace at least
    :data:`emulator.servers.MIN_PACE`, as the sharded replay's); None without a GPU
    (measured seconds keep ``compute_pace``)."""
    from .servers import MIN_PACE

    if not compute.sms:
        return None
    return max(MIN_PACE, 1.0 - compute.sm_share(net.blocks(*_request(net, c))))


def _collective_s(net: Network, c) -> tuple[float, float]:
    """``(seconds, mean bytes sent per GPU)`` of one plan collective on ``net``."""
    return net.collective(*_request(net, c))


def collective_requests(trace, net: Network, transport: str, bits=None, grad_bytes: int = 4,
                        method=None) -> list:
    """The ``(op, algorithm, bytes)`` collectives :func:`replay` asks ``net`` for, to simulate
    ahead (:meth:`Network.prefetch`).

    Parameters
    ----------
    trace : qsgd.PayloadTrace
    net : Network
    transport : str
        Key of :data:`TRANSPORTS`.
    bits : int or sequence of int, optional
        As :func:`replay` takes it.
    grad_bytes : int
        Bytes per gradient element (the compute model's ``grad_bytes``).
    method : optional
        As :func:`replay` takes it.

    Examples
    --------
    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> net = emulator.Network(topologies.from_spec("switch:4,bw=1Gbit"))
    >>> [(op, n) for op, _, n in emulator.collective_requests(trace, net, "fp16")]
    [('allreduce', 470292)]
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    per_bucket = _bucket_bits(trace, bits)
    return [_request(net, c) for k in range(trace.num_buckets)
            for c in bucket_plan(trace, k, transport, net.world_size, per_bucket[k],
                                 grad_bytes, method).collectives]


def replay(trace, G, *, transport: str = "fp32", world_size: int | None = None,
           compute: ComputeModel | None = None, algorithm: str = DEFAULT_ALGORITHM, bits: int | None = None,
           network: Network | None = None, loaded=None, compute_pace: float = 1.0,
           method=None) -> Prediction:
    """Predict one training iteration of ``trace``'s model on topology ``G``.

    Parameters
    ----------
    trace : qsgd.PayloadTrace
        Measured payloads and timings (means over its iterations are replayed).
    G : networkx.Graph
        Topology; ignored when ``network`` is given.
    transport : str
        Key of :data:`TRANSPORTS`.
    world_size : int, optional
        GPUs training (the first ``world_size`` ranks of ``G``); default all.
    compute : ComputeModel, optional
        Compute seconds (:meth:`ComputeModel.for_device` times the trace's operators on a
        GPU at a batch and precision); default the measured ones.
    algorithm : str
        Allreduce algorithm for fp32/fp16 and the raw small tensors.
    bits : int or sequence of int, optional
        QSGD bits per coordinate; default the trace's. Other widths use the packed codec's
        exact payload size and encode/decode seconds scaled by bytes (``source`` says so). A
        sequence gives each bucket its own width (one per ``trace.buckets``), as a
        :class:`qsgd.QSGDState` bit policy does.
    network : Network, optional
        A :class:`Network` to reuse (its cache) across calls; overrides ``G``, ``world_size``
        and ``algorithm``.
    loaded : networkx.Graph or Network, optional
        The network as collectives see it while the ranks compute (links calibrated on
        collectives measured under load, :attr:`emulator.MeasuredTrace.loaded`): where a
        collective needs the host's CPU and ranks share cores (gloo on CPU hosts), it runs
        far slower then. A collective progresses at this network's pace while backward or a
        hook stage runs, at ``network``'s otherwise (module docstring). Default: the same.
    compute_pace : float
        The other side of that interference: the pace (0 < pace <= 1) of the rank's compute
        (backward and the callback stages) while a collective runs, against alone (the
        harness measures it: compute-alone steps with and without a collective running all
        the while). Default 1.
    method : qsgd.PowerSGDConfig or qsgd.CompressorConfig, optional
        The settings of a transport with a :attr:`Transport.method` (default: PowerSGD at
        rank 1 as PyTorch's hook runs it; GRACE's transports need one). Its stages are timed
        on the compute model's GPU (``compute.codec_device``).

    Returns
    -------
    Prediction

    Examples
    --------
    An MLP measured on this CPU, fp32 against QSGD 4-bit on 8 GPUs behind a 1 Gbit/s switch:

    >>> import emulator, qsgd, topologies
    >>> trace = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
    ...                      device="cpu", seed=0)
    >>> G = topologies.from_spec("switch:8,bw=1Gbit")
    >>> fp32 = emulator.replay(trace, G, transport="fp32")
    >>> q4 = emulator.replay(trace, G, transport="qsgd_allgather")
    >>> round(fp32.bytes_per_gpu), round(q4.bytes_per_gpu), q4.bits, len(q4.buckets)
    (1646022, 877044, 4, 1)
    >>> q4.comm_s < fp32.comm_s
    True
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    t = TRANSPORTS[transport]
    compute = ComputeModel() if compute is None else compute
    if not isinstance(compute, ComputeModel):
        raise ConfigError(f"compute must be a ComputeModel, got {type(compute).__name__}")
    if not getattr(trace, "timed", True) and (compute.forward_s is None or compute.codec_device is None):
        raise ConfigError(f"trace of {trace.model!r} was recorded on the meta device and holds no "
                          f"seconds: pass compute=ComputeModel.for_device(<GPU>, trace)")
    net = network if network is not None else Network(G, world_size, algorithm)
    p = net.world_size
    if loaded is not None and not isinstance(loaded, Network):
        loaded = Network(loaded, p, net.algorithm)
    if loaded is not None and loaded.world_size != p:
        raise ConfigError(f"loaded: {loaded.world_size} ranks, the network has {p}")
    if isinstance(compute_pace, bool) or not isinstance(compute_pace, (int, float)) or \
            not 0.0 < compute_pace <= 1.0:
        raise ConfigError(f"compute_pace={compute_pace!r} must be a number in (0, 1]")
    pace = float(compute_pace)
    fwd, bwd, opt, ready = compute.phases(trace)

    per_bucket = _bucket_bits(trace, bits)
    if t.compressed:
        configs = [_qsgd_config(trace, b) for b in per_bucket]
        sources = sorted({src for _, src in configs})
        source = sources[0] if len(sources) == 1 else "per-bucket widths: " + "; ".join(sources)
        widths = tuple(c.bits for c, _ in configs)
    else:
        if any(b is not None and b != 8 * t.bytes_per_element for b in per_bucket):
            raise ConfigError(f"bits={bits!r} does not fit transport {transport!r} "
                              f"({8 * t.bytes_per_element} bits)")
        configs, source = None, "dense allreduce"
        widths = (8 * t.bytes_per_element,) * trace.num_buckets
    stage_device = None
    if t.method is not None:
        from emulator.compute import device as device_named

        method = method_config(transport, method)
        source = f"{t.description}; {method.to_dict()}"
        if compute.codec_device is None:
            raise ConfigError(f"transport {transport!r} times its stages on a GPU: pass "
                              f"compute=ComputeModel.for_device(<GPU>, trace)")
        stage_device = device_named(compute.codec_device)
    else:
        method_config(transport, method)

    plans = [bucket_plan(trace, k, transport, p, per_bucket[k], compute.grad_bytes, method)
             for k in range(trace.num_buckets)]
    # the three servers' work (module docstring): backward's thread, callback thread, stream
    backward, callbacks, stream = [], [], []
    codec_total, bytes_total = 0.0, 0.0
    reached = 0.0                    # forward and backward work (s) before the next item
    for k, b in enumerate(trace.buckets):
        enc_el = dec_el = 0.0
        if t.compressed and b.compressed_numel:
            enc, dec = compute.codec(trace, k, configs[k][0])
            enc_el = enc / b.compressed_numel
            dec_el = dec / b.compressed_numel
        target = fwd + ready[k]
        backward.append(Work(("ready", k), max(0.0, target - reached)))
        reached = max(reached, target)
        for j, step in enumerate(plans[k].steps):
            after = ("ready", k) if step.after is None else (k, step.after)
            if step.kind == "stage":
                dur = enc_el * step.encode_numel + dec_el * step.decode_numel
                if stage_device is not None:
                    dur = stage_seconds(plans[k], step, stage_device) * compute.codec_scale
                codec_total += dur
                # hook stages: in backward's thread, delaying the rest of backward
                (backward if step.runs_in == "hook" else callbacks).append(Work((k, j), dur, after))
                continue
            secs, sent = _collective_s(net, step)
            bytes_total += sent
            stream.append(Work((k, j), secs, after,
                               None if loaded is None else _collective_s(loaded, step)[0],
                               gpu_pace(net, step, compute)))
    backward.append(Work("rest of backward", max(0.0, fwd + bwd - reached)))
    times = overlap.run(backward, callbacks, stream, share=SHARE, pace=pace)

    timeline = []
    for k, plan in enumerate(plans):
        ready = times["ready", k][1]
        steps = list(enumerate(plan.steps))
        colls = [(st.name, *times[k, j]) for j, st in steps if st.kind != "stage"]
        hook_ends = [times[k, j][1] for j, st in steps
                     if st.kind == "stage" and st.runs_in == "hook"]
        enc_end = max(hook_ends, default=ready)
        first = next((st for st in plan.steps if st.kind != "stage"), None)
        issued = enc_end if first is None else \
            ready if first.after is None else times[k, first.after][1]
        comm = sum(e - a for _, a, e in colls)
        timeline.append(BucketTimeline(
            k, ready, ready, enc_end, max((c[2] for c in colls), default=enc_end),
            max((times[k, j][1] for j, _ in steps), default=ready),
            sum(c.nbytes for c in plan.collectives), comm, source,
            colls[0][1] if colls else enc_end, tuple(colls), issued))

    last = max((b.end_s for b in timeline), default=0.0)
    iteration = max(times["backward end"][1], last) + opt
    compute_s = fwd + bwd + opt
    return Prediction(
        iteration_s=iteration, compute_s=compute_s, exposed_comm_s=max(0.0, iteration - compute_s),
        encode_decode_s=codec_total, forward_s=fwd, backward_s=bwd, optimizer_s=opt,
        bytes_per_gpu=bytes_total, transport=transport, bits=max(widths, default=0), world_size=p,
        algorithm=net.algorithm, topology=net.name, source=source, buckets=tuple(timeline),
        bucket_bits=widths)


def _bucket_bits(trace, bits) -> list:
    """``bits`` as one entry per bucket (None: the trace's own width)."""
    if bits is None or is_int(bits):
        return [bits] * trace.num_buckets
    if isinstance(bits, (str, bytes)) or not hasattr(bits, "__len__"):
        raise ConfigError(f"bits must be an int or one int per bucket, got {bits!r}")
    bits = list(bits)
    if len(bits) != trace.num_buckets:
        raise ConfigError(f"bits: expected one width per bucket ({trace.num_buckets}), got {len(bits)}")
    for k, b in enumerate(bits):
        if not is_int(b):
            raise ConfigError(f"bits[{k}] must be an int, got {b!r}")
    return bits

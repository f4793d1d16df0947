"""Replay one training iteration of a measured model over a simulated cluster (:func:`emulator.replay`).

Named ``replaying`` so that importing it does not shadow the public function ``emulator.replay``.

The model of an iteration (as PyTorch DDP with NCCL runs it):

1. forward (``forward_s``);
2. backward; bucket ``k`` becomes ready ``ready_s[k]`` seconds into backward (measured);
3. one communication stream: buckets are reduced strictly in order, each one
   encode -> collective -> decode, starting when it is ready and the stream is free; this
   overlaps the rest of backward (NCCL runs collectives on one stream per communicator,
   Li et al., "PyTorch Distributed", VLDB 2020, Section 3.2.3);
4. the optimizer step once backward and the last bucket are done.

Each bucket's collective is simulated by the emulator (:func:`emulator.build_schedule` and
:func:`emulator.simulate` on the graph); results are cached per (op, algorithm, bytes,
payloads) since buckets of equal size repeat. Small tensors that QSGD sends uncompressed
(the paper's rule, Alistarh et al. 2017, Section 5) travel as :func:`qsgd.qsgd_hook` sends
them: in front of the payload in the all-gather transport's one collective; for
scatter-reduce-allgather as a separate fp32 ring allreduce in the same stream, issued before
the encode (which runs while it is in flight) and finished before the compressed payload goes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from emulator.compute import ComputeModel
from emulator.errors import ConfigError
from emulator.network import DEFAULT_ALGORITHM, Network

FP32_BYTES = 4


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
        go separately as fp32).
    bytes_per_element : int or None
        Wire bytes per element of an uncompressed allreduce (4 fp32, 2 fp16).
    algorithm : str or None
        The emulator's algorithm name of a compressed transport.
    description : str
    """

    name: str
    compressed: bool
    bytes_per_element: int | None
    algorithm: str | None
    description: str


#: Transports a bucket can be sent with.
TRANSPORTS: dict[str, Transport] = {
    "fp32": Transport("fp32", False, 4, None, "fp32 allreduce (DDP's default)"),
    "fp16": Transport("fp16", False, 2, None, "fp16 allreduce (DDP's fp16_compress_hook)"),
    "qsgd_allgather": Transport(
        "qsgd_allgather", True, None, "qsgd_allgather",
        "each rank all-gathers its QSGD payload, every rank decodes and sums all (the paper's scheme)"),
    "qsgd_scatter_reduce_allgather": Transport(
        "qsgd_scatter_reduce_allgather", True, None, "qsgd_scatter_reduce_allgather",
        "ranks quantize the chunk each owner reduces, owners decode, sum, requantize, all-gather"),
}


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class BucketTimeline:
    """One bucket in the predicted iteration (seconds from the start of the iteration).

    ``comm_s`` is the network time of the bucket's collectives; with QSGD the small-tensor
    allreduce runs under the encode, so ``comm_end - encode_end`` can be less than it.
    """

    index: int
    ready_s: float
    start_s: float
    encode_end: float
    comm_end: float
    end_s: float
    wire_bytes: int
    comm_s: float
    source: str


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one training iteration (seconds) and its breakdown.

    ``exposed_comm_s`` is the part of the iteration not covered by compute:
    ``iteration_s - compute_s`` (it includes encode/decode on the communication stream when
    they are not hidden behind backward). ``encode_decode_s`` is the total codec time of all
    buckets (hidden or not). ``bytes_per_gpu`` is the mean bytes each GPU sends per iteration.
    """

    iteration_s: float
    compute_s: float
    exposed_comm_s: float
    encode_decode_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    bytes_per_gpu: float
    transport: str
    bits: int
    world_size: int
    algorithm: str
    topology: str
    source: str
    buckets: tuple[BucketTimeline, ...] = field(repr=False)

    @property
    def comm_s(self) -> float:
        """Sum of the buckets' collective seconds (exposed or overlapped)."""
        return sum(b.comm_s for b in self.buckets)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["buckets"] = [asdict(b) for b in self.buckets]
        d["comm_s"] = self.comm_s
        return d


# ---------------------------------------------------------------- per-bucket sizes
def _qsgd_config(trace, bits: int | None):
    """The QSGD config to replay at: the trace's, or the packed codec at ``bits``."""
    import qsgd

    cfg = trace.config
    if bits is None or bits == cfg.bits:
        return cfg, "measured payloads"
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ConfigError(f"bits must be an int in [2, 16] for a QSGD transport, got {bits!r}")
    new = qsgd.QSGDConfig.from_bits(bits, bucket_size=cfg.bucket_size, norm=cfg.norm, codec="packed")
    return new, (f"packed payload sizes at {bits} bits (exact, qsgd.payload_nbytes); "
                 f"encode/decode scaled by bytes from {cfg.bits}-bit measurements")


def _bucket_payload(trace, k: int, cfg) -> tuple[float, float, float]:
    """``(payload bytes, encode_s, decode_s)`` of bucket ``k`` (measured means, or rescaled)."""
    import qsgd

    b = trace.buckets[k]
    measured = trace.mean_payload_bytes(k)
    enc, dec = trace.mean_encode_s(k), trace.mean_decode_s(k)
    if cfg is trace.config or b.compressed_numel == 0:
        return measured, enc, dec
    payload = float(qsgd.payload_nbytes(b.compressed_numel, cfg))
    ratio = payload / measured if measured > 0 else 1.0
    return payload, enc * ratio, dec * ratio


def _chunk_payloads(payload: float, numel: int, p: int) -> list[int]:
    """Per-chunk payload bytes when a payload of ``numel`` elements is split in ``p`` chunks."""
    base, extra = divmod(numel, p)
    sizes = [base + (1 if c < extra else 0) for c in range(p)]
    return [max(1, math.ceil(payload * s / numel)) if s else 0 for s in sizes]


# ---------------------------------------------------------------- replay
def replay(trace, G, *, transport: str = "fp32", world_size: int | None = None,
           compute: ComputeModel | None = None, algorithm: str = DEFAULT_ALGORITHM, bits: int | None = None,
           network: Network | None = None) -> Prediction:
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
        Compute seconds; default the measured ones.
    algorithm : str
        Allreduce algorithm for fp32/fp16 and the raw small tensors.
    bits : int, optional
        QSGD bits per coordinate; default the trace's. Other widths use the packed codec's
        exact payload size and encode/decode seconds scaled by bytes (``source`` says so).
    network : Network, optional
        A :class:`Network` to reuse (its cache) across calls; overrides ``G``, ``world_size``
        and ``algorithm``.

    Returns
    -------
    Prediction
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {sorted(TRANSPORTS)}, got {transport!r}")
    t = TRANSPORTS[transport]
    compute = ComputeModel() if compute is None else compute
    if not isinstance(compute, ComputeModel):
        raise ConfigError(f"compute must be a ComputeModel, got {type(compute).__name__}")
    net = network if network is not None else Network(G, world_size, algorithm)
    p = net.world_size
    fwd, bwd, opt, ready_scale = compute.phases(trace)

    if t.compressed:
        cfg, source = _qsgd_config(trace, bits)
        used_bits = cfg.bits
        op = net.op_of(t.algorithm)
    else:
        if bits is not None and bits != 8 * t.bytes_per_element:
            raise ConfigError(f"bits={bits!r} does not fit transport {transport!r} "
                              f"({8 * t.bytes_per_element} bits)")
        cfg, source, used_bits = None, "dense allreduce", 8 * t.bytes_per_element

    stream_free = 0.0
    timeline, codec_total, bytes_total = [], 0.0, 0.0
    for k, b in enumerate(trace.buckets):
        ready = fwd + trace.mean_ready_s(k) * ready_scale
        start = max(ready, stream_free)
        if t.compressed:
            payload, enc, dec = _bucket_payload(trace, k, cfg)
            enc, dec = compute.codec_seconds(enc), compute.codec_seconds(dec)
            comm, sent, raw_comm = 0.0, 0.0, 0.0
            # qsgd.qsgd_hook's allgather transport carries the raw small tensors in front of
            # the payload, in its one all_gather
            raw_bytes = FP32_BYTES * b.raw_numel
            folded = bool(t.algorithm == "qsgd_allgather" and b.compressed_numel and raw_bytes)
            wire = raw_bytes
            if b.compressed_numel:
                wire += round(payload)
                if t.algorithm == "qsgd_allgather":
                    sizes = [round(payload) + (raw_bytes if folded else 0)] * p
                else:
                    sizes = _chunk_payloads(payload, b.compressed_numel, p)
                c, s = net.collective(op, t.algorithm, FP32_BYTES * b.compressed_numel, sizes)
                comm, sent = comm + c, sent + s
            else:
                enc = dec = 0.0
            if raw_bytes and not folded:
                raw_comm, s = net.collective("allreduce", net.algorithm, raw_bytes)
                sent += s
            enc_end = start + enc
            # qsgd.qsgd_hook issues the small-tensor allreduce before it encodes and the
            # payload collective after both (one stream): the encode hides the former
            comm_end = max(enc_end, start + raw_comm) + comm
            comm += raw_comm
        else:
            enc = dec = 0.0
            wire = t.bytes_per_element * b.numel
            comm, sent = net.collective("allreduce", net.algorithm, wire)
            enc_end = start
            comm_end = start + comm
        end = comm_end + dec
        stream_free = end
        codec_total += enc + dec
        bytes_total += sent
        timeline.append(BucketTimeline(k, ready, start, enc_end, comm_end, end, int(wire), comm, source))

    compute_s = fwd + bwd + opt
    iteration = max(fwd + bwd, stream_free) + opt
    return Prediction(
        iteration_s=iteration, compute_s=compute_s, exposed_comm_s=max(0.0, iteration - compute_s),
        encode_decode_s=codec_total, forward_s=fwd, backward_s=bwd, optimizer_s=opt,
        bytes_per_gpu=bytes_total, transport=transport, bits=used_bits, world_size=p,
        algorithm=net.algorithm, topology=net.name, source=source, buckets=tuple(timeline))

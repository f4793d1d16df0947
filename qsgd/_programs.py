"""What the hook runs for one bucket: a program per transport (see :mod:`qsgd._inflight`).

A program is a generator: it does a bucket's local work (copies, residuals, encode; decode and
average) and yields the collectives of the bucket's :func:`qsgd.wire_plan`, in plan order; its
return value is the averaged bucket. :data:`PROGRAMS` maps each QSGD transport to its program;
:func:`_warmup` is the plain allreduce of the warm-up steps.
"""
import torch
import torch.distributed as dist

from qsgd import devicecodec, rng
from qsgd._inflight import Issue, Join, Runner
from qsgd.codec import decode, encode, payload_nbytes
from qsgd.errors import HookError, PayloadError
from qsgd.quantizer import flat_float32, raise_nonfinite
from qsgd.wireplan import BucketLayout

# All-gather into one flat tensor (``all_gather_single`` from torch 2.13, the same call
# as ``all_gather_into_tensor`` before): no per-rank output tensors to allocate and copy.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _group_device(group) -> torch.device:
    # NCCL moves only CUDA tensors; gloo only CPU ones here.
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _param_key(state, p: torch.Tensor) -> int:
    # Parameters are numbered in the order the hook first meets them. A fresh DDP's first
    # iteration always uses the same bucket layout (reverse parameter order), so the numbering,
    # and with it the residuals of a checkpoint, carry over to a new process.
    key = state._param_keys.get(id(p))
    if key is None:
        key = state._param_keys[id(p)] = len(state._param_keys)
    return key


def _layout(state, bucket) -> tuple:
    """Where the bucket's compressed and raw elements are in its buffer.

    Returns ``(compressed_runs, raw_index, keys, numels, layout)``: ``(offset, numel)`` runs of
    the buffer holding the parameters with >= ``min_numel`` elements, parameter by parameter in
    key order (adjacent runs merged), the positions of the others, the compressed parameters'
    keys and sizes in that order, and the :class:`BucketLayout` of the plan. The canonical
    order makes the payload (its scale buckets and random streams) independent of DDP's
    bucket rebuild after the first iteration, which reorders a bucket's parameters; so a
    resumed run quantizes exactly as the uninterrupted one. Runs are copied with slices: an
    index gather reads an 8-byte index per element, and took as long as the encode itself.
    """
    buf = bucket.buffer()
    params = bucket.parameters()
    keys = tuple(_param_key(state, p) for p in params)
    cached = state._layouts.get(keys)
    if cached is None:
        numels = [p.numel() for p in params]
        if sum(numels) != buf.numel():
            raise HookError(f"bucket {bucket.index()}: parameters hold {sum(numels)} elements but "
                            f"the buffer {buf.numel()}")
        offsets = [sum(numels[:i]) for i in range(len(numels))]
        big = sorted((k, o, n) for k, o, n in zip(keys, offsets, numels) if n >= state.min_numel)
        small = [(o, n) for o, n in zip(offsets, numels) if n < state.min_numel]
        runs: list[tuple[int, int]] = []
        for _, o, n in big:
            if runs and runs[-1][0] + runs[-1][1] == o:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((o, n))
        ridx = torch.cat([torch.arange(o, o + n) for o, n in small]) if small else torch.empty(0, dtype=torch.long)
        layout = BucketLayout.by_size(numels, state.min_numel, buf.element_size())
        cached = state._layouts[keys] = (runs, ridx.to(buf.device), [k for k, _, _ in big],
                                         [n for _, _, n in big], layout)
    return cached


def _gather_runs(buf: torch.Tensor, runs) -> torch.Tensor:
    """The elements of ``runs`` in order, as float32 (a view when one fp32 run covers them)."""
    if len(runs) == 1:
        o, n = runs[0]
        return buf[o:o + n].float()
    return torch.cat([buf[o:o + n] for o, n in runs]).float()


def _scatter_runs(buf: torch.Tensor, runs, values: torch.Tensor) -> None:
    start = 0
    for o, n in runs:
        buf[o:o + n].copy_(values[start:start + n])
        start += n


def _mean_in_order(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Their mean, summed in list order into one buffer: every rank adds the same tensors in
    the same order (identical results), and a stack would allocate all of them again."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc.add_(t)
    return acc.div_(len(tensors))


class _Bucket:
    """What a bucket's program needs: the state, the bucket and its layout, the step."""

    def __init__(self, state, bucket, step: int, runner: Runner):
        self.state, self.step, self.run = state, step, runner
        self.buf = bucket.buffer()
        self.index = bucket.index()
        self.p, self.rank = state.world_size, state.rank
        self.group = state.process_group
        self.device = _group_device(state.process_group)
        self.cruns, self.ridx, self.ckeys, self.cnumels, self.layout = _layout(state, bucket)
        # the bucket's width under the state's bit policy (its payloads carry it: self-describing)
        self.cfg = state.bucket_config(self.ckeys)

    def on_device(self) -> bool:
        """Whether the packed codec runs with its checks left on the device (not on CPU, where
        the numba kernels are faster and checking costs nothing)."""
        return self.buf.device.type != "cpu" and self.cfg.codec == "packed"

    def encode(self, x: torch.Tensor, rank: int, stream: int) -> torch.Tensor:
        if self.on_device():
            key = rng.stream_key(self.state.seed, rank, self.step, stream)
            flat = flat_float32(x)
            payload, finite = devicecodec.encode(flat, self.cfg, key, x.dtype, tuple(x.shape))
            self.run.check(finite, lambda: _nonfinite_message(flat))
        else:
            payload = encode(x, self.cfg, self.state.seed, rank=rank, step=self.step,
                             bucket=stream)
        with self.run.stream.lock:
            self.run.stats.payload_bytes += payload.numel()
            if rank == self.rank:   # the first-phase payloads, not a re-quantized mean
                sizes = self.run.stats.payload_sizes
                sizes[self.index] = sizes.get(self.index, 0) + payload.numel()
        return payload

    def all_gather(self, name: str, tensor: torch.Tensor, wait: bool = True):
        """``Issue`` of an all_gather of ``tensor`` into one flat tensor; returns (issue, out)."""
        out = torch.empty(self.p * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        issue = Issue(name, tensor, lambda: _ALL_GATHER(out, tensor, group=self.group, async_op=True),
                      wait)
        return issue, out.view(self.p, -1)

    def gather_payloads(self, payload: torch.Tensor, numels: list[int], names: tuple[str, str],
                        raw: torch.Tensor | None = None):
        """All ranks' payloads (unpadded) and ``raw`` tensors; rank ``r`` encoded ``numels[r]``.

        A generator (``yield from``): packed payload sizes are computed, elias sizes are
        all-gathered first (``names[0]``), then the payloads go in one all_gather
        (``names[1]``), each padded to the largest, with ``raw`` (same size on every rank) in
        front as its bytes: a separate allreduce of a few KB would cost another round trip.
        """
        cfg, rank = self.cfg, self.rank
        if cfg.codec == "packed":
            sizes = [payload_nbytes(n, cfg) for n in numels]
            if payload.numel() != sizes[rank]:
                raise HookError(f"bucket {self.index}: rank {rank} encoded {payload.numel()} bytes "
                                f"for {numels[rank]} elements, expected {sizes[rank]}")
        else:
            meta = torch.tensor([payload.numel(), numels[rank]], dtype=torch.int64, device=self.device)
            issue, metas = self.all_gather(names[0], meta)
            yield issue
            metas = metas.cpu()
            got = metas[:, 1].tolist()
            if got != list(numels):
                raise HookError(f"bucket {self.index}: ranks hold element counts {got}, expected "
                                f"{list(numels)} (the models or min_numel differ across ranks)")
            sizes = metas[:, 0].tolist()
        # raw first; its bytes are copied out of each row before they are viewed as raw's
        # dtype (a row's offset need not be a multiple of the dtype's size)
        lead = 0 if raw is None else raw.numel() * raw.element_size()
        padded = torch.zeros(lead + max(sizes), dtype=torch.uint8, device=self.device)
        if raw is not None:
            padded[:lead] = raw.contiguous().view(torch.uint8).to(self.device)
        padded[lead: lead + payload.numel()] = payload.to(self.device)
        issue, got = self.all_gather(names[1], padded)
        yield issue
        raws = None if raw is None else [g[:lead].clone().view(raw.dtype).to(raw.device) for g in got]
        return [g[lead: lead + s] for g, s in zip(got, sizes)], raws

    def finish(self, x, mean, own, small_mean) -> torch.Tensor:
        """Write the averaged bucket into DDP's buffer; keep the residuals."""
        buf = self.buf
        if small_mean is not None:
            buf[self.ridx] = small_mean.to(buf.dtype)
        if self.state.error_feedback and own is not None:
            # Kept per parameter (not per bucket) so that a rebuilt bucket layout still matches.
            for k, r in zip(self.ckeys, torch.split((x - own).detach(), self.cnumels)):
                self.state.residuals[k] = r
        if mean is not None:
            _scatter_runs(buf, self.cruns, mean.to(buf.dtype))
        return buf

    def compressed_input(self) -> torch.Tensor:
        x = _gather_runs(self.buf, self.cruns)
        res = self.state.residuals
        if self.state.error_feedback and all(k in res for k in self.ckeys):
            x = x + torch.cat([res[k].to(x.device) for k in self.ckeys])
        return x

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        """The tensor of a payload of ``numel`` elements of the bucket's dtype."""
        if not self.on_device():
            return decode(payload, device=self.buf.device)
        # a gloo group gathers CUDA payloads on the host: decode where the bucket lives
        y, ok = devicecodec.decode(payload.to(self.buf.device), numel, self.cfg, self.buf.dtype)
        self.run.check(ok, lambda: _payload_message(payload))
        return y.to(self.buf.dtype)


def _nonfinite_message(flat: torch.Tensor) -> str:
    # read at the end of backward: ``flat`` may share memory with the bucket's buffer, which
    # holds the averaged result by then
    if bool(torch.isfinite(flat).all()):
        return "the gradient held NaN or Inf values (the bucket has been overwritten since)"
    try:
        raise_nonfinite(flat)
    except ValueError as exc:
        return f"the gradient is not finite: {exc}"
    return "the gradient is not finite"


def _payload_message(payload: torch.Tensor) -> str:
    try:
        decode(payload.cpu())
    except PayloadError as exc:
        return f"a payload does not decode: {exc}"
    return "a payload is not the one its layout says (header differs)"


def _allreduce_mean(b: _Bucket, name: str, tensor: torch.Tensor, wait: bool = True) -> Issue:
    return Issue(name, tensor, lambda: dist.all_reduce(tensor, group=b.group, async_op=True), wait)


def _warmup(b: _Bucket):
    """A plain fp32 allreduce of the whole bucket."""
    if b.p > 1:
        yield _allreduce_mean(b, "allreduce", b.buf)
        b.buf.div_(b.p)
    with b.run.stream.lock:
        b.run.stats.raw_bytes += b.buf.numel() * b.buf.element_size()
    return b.buf


def _raw_only(b: _Bucket):
    small = b.buf[b.ridx]
    with b.run.stream.lock:
        b.run.stats.raw_bytes += small.numel() * small.element_size()
    if b.p > 1:
        yield _allreduce_mean(b, "small-tensor allreduce", small)
        small.div_(b.p)
    return b.finish(None, None, None, small)


def _allgather(b: _Bucket):
    """encode -> [size all_gather] -> payload all_gather (raw tensors in front) -> decode p, mean."""
    if not b.cruns:
        return (yield from _raw_only(b))
    p, rank = b.p, b.rank
    with b.run.stage("encode"):
        small = b.buf[b.ridx] if b.ridx.numel() else None
        x = b.compressed_input()
        payload = b.encode(x, rank, b.index)
    if small is not None:
        with b.run.stream.lock:
            b.run.stats.raw_bytes += small.numel() * small.element_size()
    if p == 1:
        with b.run.stage("decode"):
            own = b.decode(payload, x.numel())
            return b.finish(x, own, own, small)
    payloads, raws = yield from b.gather_payloads(payload, [x.numel()] * p,
                                                  ("size all_gather", "payload all_gather"), small)
    with b.run.stage("decode"):
        decoded = [b.decode(g, x.numel()) for g in payloads]
        mean = _mean_in_order(decoded)
        return b.finish(x, mean, decoded[rank], None if raws is None else _mean_in_order(raws))


def _scatter_reduce_allgather(b: _Bucket):
    """[small-tensor allreduce] -> encode p chunks -> [sizes] -> chunk all_to_all -> decode,
    average, re-encode the owned chunk -> [sizes] -> mean chunk all_gather -> decode."""
    if not b.cruns:
        return (yield from _raw_only(b))
    p, rank, cfg = b.p, b.rank, b.cfg
    small = b.buf[b.ridx] if b.ridx.numel() else None
    pending = None
    if small is not None:
        with b.run.stream.lock:
            b.run.stats.raw_bytes += small.numel() * small.element_size()
        if p > 1:
            # issued before the encode, which it runs under (PyTorch's PowerSGD hook overlaps
            # its uncompressed tensors the same way); joined at the end
            pending = yield _allreduce_mean(b, "small-tensor allreduce", small, wait=False)
    with b.run.stage("encode"):
        x = b.compressed_input()
        chunks = torch.tensor_split(x, p)
        # Distinct streams: chunk j of bucket b is stream b * p + j; the re-quantization of
        # the owner's mean uses rank p + owner so it never reuses a first-phase stream.
        payloads = [b.encode(c, rank, b.index * p + j) for j, c in enumerate(chunks)]
        own = (torch.cat([b.decode(pl, c.numel()) for pl, c in zip(payloads, chunks)])
               if b.state.error_feedback else None)
    if p == 1:
        mine = [payloads[0]]
    else:
        in_splits = [pl.numel() for pl in payloads]
        if cfg.codec == "packed":
            # every rank's chunk ``rank`` has the same length: its payload size is known
            out_splits = [payload_nbytes(chunks[rank].numel(), cfg)] * p
        else:
            in_sizes = torch.tensor(in_splits, dtype=torch.int64, device=b.device)
            out_sizes = torch.empty_like(in_sizes)
            yield Issue("chunk size all_to_all", in_sizes,
                        lambda: dist.all_to_all_single(out_sizes, in_sizes, group=b.group,
                                                       async_op=True))
            out_splits = out_sizes.cpu().tolist()
        recv = torch.empty(sum(out_splits), dtype=torch.uint8, device=b.device)
        send = torch.cat(payloads).to(b.device)
        yield Issue("chunk all_to_all", send,
                    lambda: dist.all_to_all_single(recv, send, out_splits, in_splits, group=b.group,
                                                   async_op=True))
        mine = list(torch.split(recv, out_splits))
    with b.run.stage("reduce" if p > 1 else "encode"):
        summed = torch.stack([b.decode(pl, chunks[rank].numel()) for pl in mine]).sum(0).div_(p)
        requant = b.encode(summed, p + rank, b.index * p + rank)
    if p == 1:
        parts = [requant]
    else:
        parts, _ = yield from b.gather_payloads(requant, [c.numel() for c in chunks],
                                                ("mean chunk size all_gather", "mean chunk all_gather"))
    with b.run.stage("decode"):
        mean = torch.cat([b.decode(pl, c.numel()) for pl, c in zip(parts, chunks)])
    small_mean = None
    if small is not None:
        if pending is not None:
            yield Join(pending)
            small.div_(p)
        small_mean = small
    return b.finish(x, mean, own, small_mean)


#: QSGD transport -> program
PROGRAMS = {"allgather": _allgather, "scatter_reduce_allgather": _scatter_reduce_allgather}

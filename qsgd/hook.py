"""QSGD as a ``DistributedDataParallel`` communication hook (Alistarh et al., NeurIPS 2017, sec. 3).

Usage, in the style of ``torch.distributed.algorithms.ddp_comm_hooks``::

    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport="allgather")
    ddp_model.register_comm_hook(state, qsgd.qsgd_hook)

Quantized payloads cannot be summed by an allreduce (the sum of two payloads is not a payload),
so the hook moves encoded bytes and decodes at the receiver:

``allgather``
    Each rank encodes its bucket (random stream ``(seed, rank, step, bucket)``), the payloads are
    all-gathered (packed payload sizes are known to every rank; the elias codec's differ, so
    they are all-gathered first and shorter payloads padded) and every rank decodes all of them and takes the mean. All ranks average the same
    decoded tensors in the same order, so they end every step with identical parameters.
``scatter_reduce_allgather``
    The bucket is split in ``world_size`` chunks; rank ``r`` encodes chunk ``j`` for its owner
    ``j`` (an ``all_to_all``), the owner decodes and averages its chunk, re-quantizes the mean and
    all-gathers it; everyone decodes. Bytes per rank fall from ``(p-1) P`` to about ``2 (p-1) P / p``
    at the price of a second quantization (the variance of two QSGD steps, sec. 3.1).

Parameters with fewer than ``min_numel`` elements travel uncompressed (the paper's rule, sec. 5:
small tensors cost more in scales than they save): with ``allgather`` in front of the payload in
its all_gather, one collective per bucket; with ``scatter_reduce_allgather`` by a ring allreduce
issued before the encode and waited for after it, so the two overlap. The first
``warmup_steps`` steps use a plain allreduce of the whole bucket. With ``error_feedback`` each
rank keeps the part its quantizer dropped (``x - Q(x)`` per bucket) and adds it to the next step's
gradient (Karimireddy et al., ICML 2019, "Error feedback fixes SignSGD").

The compressed collectives are issued and waited for inside the hook, each bounded by
``timeout_s``: a dead peer or a disagreement between ranks becomes a :class:`qsgd.HookError` on
every rank instead of a hang. The returned future is already completed.
"""
import json
import math
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from qsgd.codec import decode, encode, payload_nbytes
from qsgd.config import QSGDConfig
from qsgd.errors import ConfigError, HookError
from ._checks import is_int, is_number

#: transport name -> bucket function ``(state, flat, bucket, raw) -> (mean, own decoded, raw
#: mean or None)`` (filled below).
TRANSPORTS: dict[str, Any] = {}

# Bytes of the config fingerprint exchanged on the first call (JSON, zero padded).
_FINGERPRINT_BYTES = 1024


@dataclass
class _StepStats:
    payload_bytes: int = 0     # QSGD payload bytes this rank encoded
    raw_bytes: int = 0         # fp32 bytes of uncompressed (small or warm-up) tensors
    bytes_sent: int = 0        # bytes this rank puts on the wire (direct exchange, see _sent)
    encode_s: float = 0.0
    decode_s: float = 0.0
    comm_s: float = 0.0
    hook_s: float = 0.0        # wall seconds inside the hook: local work is hook_s - comm_s
    buckets: int = 0
    # (issued, wait start, wait end) time.perf_counter() seconds of every collective, in
    # order: the waits split the step into local-work segments (the validation harness takes
    # the slowest rank per segment, as each collective waits for it); issued < wait start
    # when local work overlapped the collective.
    waits: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {**self.__dict__, "waits": list(self.waits)}


class QSGDState:
    """State of :func:`qsgd_hook`: configuration, step counter, residuals and statistics.

    Parameters
    ----------
    config : QSGDConfig
    transport : {"allgather", "scatter_reduce_allgather"}
    min_numel : int
        Parameters with fewer elements are sent uncompressed (fp32 allreduce).
    warmup_steps : int
        Steps of plain allreduce before compression starts.
    error_feedback : bool
        Keep each bucket's quantization error and add it to the next step's gradient.
    process_group : ProcessGroup, optional
        Default: the default group.
    seed : int
        Seed of the random streams (with rank, step and bucket index).
    timeout_s : float
        Bound on each collective of the compressed path (seconds).

    Attributes
    ----------
    step : int
        Steps completed (advanced after the last bucket of each backward).
    last_stats : dict
        The finished step's ``payload_bytes``, ``raw_bytes``, ``bytes_sent`` (bytes),
        ``encode_s``, ``decode_s``, ``comm_s``, ``hook_s`` (seconds; ``hook_s`` is the wall
        time inside the hook, so ``hook_s - comm_s`` is its local work: copies, codec,
        averaging), ``buckets``, ``waits`` (``(issued, wait start, wait end)``
        ``time.perf_counter()`` seconds of each collective).
    """

    def __init__(self, config: QSGDConfig, transport: str = "allgather", min_numel: int = 10_000,
                 warmup_steps: int = 0, error_feedback: bool = False, process_group=None,
                 seed: int = 0, timeout_s: float = 300.0):
        if not isinstance(config, QSGDConfig):
            raise ConfigError(f"config: expected a QSGDConfig, got {type(config).__name__}")
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport: expected one of {sorted(TRANSPORTS)}, got {transport!r}")
        for name, value in (("min_numel", min_numel), ("warmup_steps", warmup_steps), ("seed", seed)):
            if not is_int(value) or value < 0:
                raise ConfigError(f"{name}: expected an int >= 0, got {value!r}")
        if not isinstance(error_feedback, bool):
            raise ConfigError(f"error_feedback: expected a bool, got {error_feedback!r}")
        if not is_number(timeout_s) \
                or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ConfigError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        self.config = config
        self.transport = transport
        self.min_numel = min_numel
        self.warmup_steps = warmup_steps
        self.error_feedback = error_feedback
        self.process_group = process_group
        self.seed = seed
        self.timeout_s = float(timeout_s)
        self.step = 0
        self.residuals: dict[int, torch.Tensor] = {}
        self.last_stats: dict = _StepStats().as_dict()
        self._stats = _StepStats()
        self._checked = False
        self._pending = None     # (work, what, issued at, done) of a collective in flight
        self._layouts: dict[tuple, tuple] = {}
        self._param_keys: dict[int, int] = {}

    # --- identity and checkpoints --------------------------------------------------------

    def fingerprint(self) -> dict:
        """The settings every rank must share (compared across ranks on the first call)."""
        return {"config": self.config.to_dict(), "transport": self.transport,
                "min_numel": self.min_numel, "warmup_steps": self.warmup_steps,
                "error_feedback": self.error_feedback, "seed": self.seed, "step": self.step,
                "world_size": self.world_size}

    @property
    def rank(self) -> int:
        return dist.get_rank(self.process_group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def state_dict(self) -> dict:
        """Step counter, error-feedback residuals and settings, for ``torch.save``."""
        return {"step": self.step, "config": self.config.to_dict(), "transport": self.transport,
                "min_numel": self.min_numel, "warmup_steps": self.warmup_steps,
                "error_feedback": self.error_feedback, "seed": self.seed,
                "residuals": {k: v.detach().clone().cpu() for k, v in self.residuals.items()}}

    def load_state_dict(self, sd: dict) -> None:
        """Resume from :meth:`state_dict`; the settings must match this state's."""
        mine = self.state_dict()
        for key in ("config", "transport", "min_numel", "warmup_steps", "error_feedback", "seed"):
            if key not in sd:
                raise HookError(f"state_dict: missing field {key!r}")
            if sd[key] != mine[key]:
                raise HookError(f"state_dict: field {key!r} is {sd[key]!r} in the checkpoint but "
                                f"{mine[key]!r} in this QSGDState")
        step = sd.get("step")
        if not is_int(step) or step < 0:
            raise HookError(f"state_dict: field 'step' must be an int >= 0, got {step!r}")
        self.step = step
        self.residuals = {int(k): v.clone() for k, v in sd.get("residuals", {}).items()}
        # The new fingerprint (with the restored step) is compared again on the next call.
        self._checked = False

    # --- collectives with bounded waits ---------------------------------------------------

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(timedelta(seconds=self.timeout_s))
        except Exception as exc:  # gloo/NCCL raise RuntimeError or DistBackendError subclasses
            raise HookError(f"rank {self.rank}: {what} at step {self.step} failed or timed out "
                            f"after timeout_s={self.timeout_s:g}: {exc}") from exc

    def _collective(self, issue, what: str) -> None:
        """Issue an async collective, wait for it (bounded), and record the wait.

        A collective started with :meth:`_start` is finished first: collectives complete in
        the order they were issued (one NCCL stream; gloo's queue), and the hook keeps it so.
        """
        self._finish_pending()
        t0 = time.perf_counter()
        self._wait(issue(), what)
        t1 = time.perf_counter()
        self._stats.comm_s += t1 - t0
        self._stats.waits.append((t0, t0, t1))

    def _start(self, issue, what: str, done) -> None:
        """Issue an async collective and return; ``done()`` runs after its (bounded) wait."""
        self._finish_pending()
        t0 = time.perf_counter()
        self._pending = (issue(), what, t0, done)

    def _finish_pending(self) -> None:
        if self._pending is None:
            return
        work, what, t_issue, done = self._pending
        self._pending = None
        t0 = time.perf_counter()
        self._wait(work, what)
        t1 = time.perf_counter()
        self._stats.comm_s += t1 - t0
        self._stats.waits.append((t_issue, t0, t1))
        done()

    def _all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._collective(lambda: dist.all_gather(out, tensor, group=self.process_group,
                                                 async_op=True), what)
        return out

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, what) -> None:
        self._collective(lambda: dist.all_to_all_single(out, inp, out_splits, in_splits,
                                                        group=self.process_group, async_op=True),
                         what)

    def _all_reduce_mean(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        self._collective(lambda: dist.all_reduce(tensor, group=self.process_group, async_op=True),
                         what)
        return tensor.div_(self.world_size)

    def check_peers(self) -> None:
        """Compare :meth:`fingerprint` across ranks; :class:`HookError` names the first field that differs."""
        text = json.dumps(self.fingerprint(), sort_keys=True).encode()
        if len(text) > _FINGERPRINT_BYTES:
            raise HookError(f"fingerprint: {len(text)} bytes exceed {_FINGERPRINT_BYTES}")
        buf = torch.zeros(_FINGERPRINT_BYTES, dtype=torch.uint8)
        buf[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        device = _group_device(self.process_group)
        got = self._all_gather(buf.to(device), "config fingerprint all_gather")
        prints = [json.loads(bytes(g.cpu().numpy()).rstrip(b"\0")) for g in got]
        mine = self.fingerprint()
        for r, theirs in enumerate(prints):
            for key in sorted(set(mine) | set(theirs)):
                a, b = mine.get(key), theirs.get(key)
                if isinstance(a, dict) and isinstance(b, dict):
                    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
                    if diff:
                        k = diff[0]
                        raise HookError(f"ranks disagree on QSGDState field '{key}.{k}': rank "
                                        f"{self.rank} has {a.get(k)!r}, rank {r} has {b.get(k)!r}")
                elif a != b:
                    raise HookError(f"ranks disagree on QSGDState field '{key}': rank {self.rank} "
                                    f"has {a!r}, rank {r} has {b!r}")
        self._checked = True

    # --- per-step bookkeeping -------------------------------------------------------------

    def _end_step(self) -> None:
        self.last_stats = self._stats.as_dict()
        self._stats = _StepStats()
        self.step += 1


def _group_device(group) -> torch.device:
    # NCCL moves only CUDA tensors; gloo only CPU ones here.
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _param_key(state: QSGDState, p: torch.Tensor) -> int:
    # Parameters are numbered in the order the hook first meets them. A fresh DDP's first
    # iteration always uses the same bucket layout (reverse parameter order), so the numbering,
    # and with it the residuals of a checkpoint, carry over to a new process.
    key = state._param_keys.get(id(p))
    if key is None:
        key = state._param_keys[id(p)] = len(state._param_keys)
    return key


def _layout(state: QSGDState, bucket) -> tuple[list, torch.Tensor, list[int], list[int]]:
    """Where the bucket's compressed and raw elements are in its buffer.

    Returns ``(compressed_runs, raw_index, keys, numels)``: ``(offset, numel)`` runs of the
    buffer holding the parameters with >= ``min_numel`` elements, parameter by parameter in
    key order (adjacent runs merged), the positions of the others, and the compressed
    parameters' keys and sizes in that order. The canonical order makes the payload (its
    scale buckets and random streams) independent of DDP's bucket rebuild after the first
    iteration, which reorders a bucket's parameters; so a resumed run quantizes exactly as
    the uninterrupted one. Runs are copied with slices: an index gather reads an 8-byte index
    per element, and took as long as the encode itself.
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
        cached = state._layouts[keys] = (runs, ridx.to(buf.device),
                                         [k for k, _, _ in big], [n for _, _, n in big])
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


def _encode(state: QSGDState, x: torch.Tensor, rank: int, bucket: int) -> torch.Tensor:
    t0 = time.perf_counter()
    payload = encode(x, state.config, state.seed, rank=rank, step=state.step, bucket=bucket)
    state._stats.encode_s += time.perf_counter() - t0
    state._stats.payload_bytes += payload.numel()
    return payload


def _decode(state: QSGDState, payload: torch.Tensor, device) -> torch.Tensor:
    t0 = time.perf_counter()
    out = decode(payload, device=device)
    state._stats.decode_s += time.perf_counter() - t0
    return out


def _gather_payloads(state: QSGDState, payload: torch.Tensor, numels: list[int], what: str,
                     raw: torch.Tensor | None = None) -> tuple[list, list | None]:
    """All ranks' payloads (unpadded), and their ``raw`` tensors; rank ``r`` encoded ``numels[r]``.

    Packed payloads have a size every rank can compute (:func:`qsgd.payload_nbytes`), so one
    all_gather moves them; Elias sizes depend on the data and are all-gathered first. On a
    latency-bound network (small buckets, or CPU ranks that share cores) that second round
    trip costs as much as the payload itself. ``raw`` (same size on every rank) travels in
    front of the payload in the same all_gather, as its bytes: a separate allreduce of a few
    KB would cost another round trip of latency.
    """
    device = _group_device(state.process_group)
    rank = state.rank
    if state.config.codec == "packed":
        sizes = [payload_nbytes(n, state.config) for n in numels]
        if payload.numel() != sizes[rank]:
            raise HookError(f"{what}: rank {rank} encoded {payload.numel()} bytes for "
                            f"{numels[rank]} elements, expected {sizes[rank]}")
    else:
        meta = torch.tensor([payload.numel(), numels[rank]], dtype=torch.int64, device=device)
        metas = [m.cpu() for m in state._all_gather(meta, f"{what} size all_gather")]
        got_numels = [int(m[1]) for m in metas]
        if got_numels != list(numels):
            raise HookError(f"{what}: ranks hold element counts {got_numels}, expected "
                            f"{list(numels)} (the models or min_numel differ across ranks)")
        sizes = [int(m[0]) for m in metas]
    # raw first: each gathered buffer starts on an allocation, so its raw bytes view back
    # as raw's dtype whatever the payload sizes
    lead = 0 if raw is None else raw.numel() * raw.element_size()
    padded = torch.zeros(lead + max(sizes), dtype=torch.uint8, device=device)
    if raw is not None:
        padded[:lead] = raw.contiguous().view(torch.uint8).to(device)
    padded[lead: lead + payload.numel()] = payload.to(device)
    got = state._all_gather(padded, f"{what} payload all_gather")
    raws = None if raw is None else [g[:lead].view(raw.dtype).to(raw.device) for g in got]
    return [g[lead: lead + s] for g, s in zip(got, sizes)], raws


def _mean_in_order(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Their mean, summed in list order into one buffer: every rank adds the same tensors in
    the same order (identical results), and a stack would allocate all of them again."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc.add_(t)
    return acc.div_(len(tensors))


def _allgather(state: QSGDState, x: torch.Tensor, bucket: int, raw=None):
    p, rank = state.world_size, state.rank
    payload = _encode(state, x, rank, bucket)
    state._stats.bytes_sent += (p - 1) * payload.numel()
    raws = None
    if p == 1:
        decoded = [_decode(state, payload, x.device)]
    else:
        payloads, raws = _gather_payloads(state, payload, [x.numel()] * p, f"bucket {bucket}", raw)
        decoded = [_decode(state, g, x.device) for g in payloads]
    return _mean_in_order(decoded), decoded[rank], None if raws is None else _mean_in_order(raws)


def _scatter_reduce_allgather(state: QSGDState, x: torch.Tensor, bucket: int, raw=None):
    if raw is not None:
        raise HookError("scatter_reduce_allgather does not carry raw tensors (see _RAW_IN_PAYLOAD)")
    p, rank = state.world_size, state.rank
    chunks = torch.tensor_split(x, p)
    # Distinct streams: chunk j of bucket b is stream bucket = b * p + j; the re-quantization of
    # the owner's mean uses rank p + owner so it never reuses a first-phase stream.
    payloads = [_encode(state, c, rank, bucket * p + j) for j, c in enumerate(chunks)]
    own = torch.cat([_decode(state, pl, x.device) for pl in payloads]) if state.error_feedback else None
    device = _group_device(state.process_group)
    if p == 1:
        mine = [payloads[0]]
    else:
        state._stats.bytes_sent += sum(pl.numel() for j, pl in enumerate(payloads) if j != rank)
        in_splits = [pl.numel() for pl in payloads]
        if state.config.codec == "packed":
            # every rank's chunk ``rank`` has the same length: its payload size is known
            out_splits = [payload_nbytes(chunks[rank].numel(), state.config)] * p
        else:
            in_sizes = torch.tensor(in_splits, dtype=torch.int64, device=device)
            out_sizes = torch.empty_like(in_sizes)
            state._all_to_all(out_sizes, in_sizes, None, None,
                              f"bucket {bucket} chunk size all_to_all")
            out_splits = out_sizes.cpu().tolist()
        recv = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        state._all_to_all(recv, torch.cat(payloads).to(device), out_splits, in_splits,
                          f"bucket {bucket} chunk all_to_all")
        mine = list(torch.split(recv, out_splits))
    summed = torch.stack([_decode(state, pl, x.device) for pl in mine]).sum(0).div_(p)
    requant = _encode(state, summed, p + rank, bucket * p + rank)
    state._stats.bytes_sent += (p - 1) * requant.numel()
    if p == 1:
        parts = [requant]
    else:
        parts, _ = _gather_payloads(state, requant, [c.numel() for c in chunks],
                                    f"bucket {bucket} mean chunk")
    mean = torch.cat([_decode(state, pl, x.device) for pl in parts])
    return mean, own, None


TRANSPORTS.update(allgather=_allgather, scatter_reduce_allgather=_scatter_reduce_allgather)
#: Transports whose payload all_gather also carries the bucket's uncompressed small tensors
#: (each rank receives them from every other: (p-1) x their bytes, in proportion to the
#: payloads it receives anyway). The others send them by a ring allreduce issued before the
#: encode, whose bytes do not grow with p.
_RAW_IN_PAYLOAD = frozenset({"allgather"})


def _completed(tensor: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


# DDP checks this exact return annotation (a string annotation would be refused).
def qsgd_hook(state: QSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the mean over ranks of the bucket's QSGD-decoded gradients.

    Parameters
    ----------
    state : QSGDState
    bucket : torch.distributed.GradBucket

    Returns
    -------
    torch.futures.Future[Tensor]
        The averaged flat bucket (written into the bucket's buffer).

    Examples
    --------
    One gloo rank, so the mean is the rank's own decoded gradient:

    >>> import torch, torch.distributed as dist, qsgd
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 100))
    >>> ddp.register_comm_hook(qsgd.QSGDState(qsgd.QSGDConfig.from_bits(8), min_numel=0),
    ...                        qsgd.qsgd_hook)
    >>> ddp(torch.ones(2, 100)).sum().backward()
    >>> ddp.module.bias.grad.tolist()[:3]                        # every output's gradient is 2
    [2.0, 2.0, 2.0]
    >>> dist.destroy_process_group()
    """
    t_enter = time.perf_counter()
    buf = bucket.buffer()
    index = bucket.index()
    try:
        if not state._checked:
            state.check_peers()
        state._stats.buckets += 1
        # Number the parameters on the very first call, warm-up included (see _param_key).
        cruns, ridx, ckeys, cnumels = _layout(state, bucket)
        if state.step < state.warmup_steps:
            state._stats.raw_bytes += buf.numel() * buf.element_size()
            state._stats.bytes_sent += _ring_allreduce_bytes(buf.numel() * buf.element_size(),
                                                             state.world_size)
            if state.world_size > 1:
                state._all_reduce_mean(buf, f"bucket {index} warm-up allreduce")
            return _completed(buf)
        p = state.world_size
        small = buf[ridx] if ridx.numel() else None
        fold = small is not None and bool(cruns) and p > 1 and state.transport in _RAW_IN_PAYLOAD
        if small is not None:
            nbytes = small.numel() * small.element_size()
            state._stats.raw_bytes += nbytes
            state._stats.bytes_sent += (p - 1) * nbytes if fold else _ring_allreduce_bytes(nbytes, p)
            if p > 1 and not fold:
                # In flight while the compressed part is copied and encoded (PyTorch's
                # PowerSGD hook overlaps its uncompressed tensors the same way); finished
                # before the next collective. A small allreduce is all latency.
                def done(small=small):
                    buf[ridx] = small.div_(state.world_size)
                state._start(lambda: dist.all_reduce(small, group=state.process_group,
                                                     async_op=True),
                             f"bucket {index} small-tensor allreduce", done)
        if cruns:
            x = _gather_runs(buf, cruns)
            if state.error_feedback and all(k in state.residuals for k in ckeys):
                x = x + torch.cat([state.residuals[k].to(x.device) for k in ckeys])
            mean, own, small_mean = TRANSPORTS[state.transport](state, x, index,
                                                                small if fold else None)
            if small_mean is not None:
                buf[ridx] = small_mean
            if state.error_feedback:
                # Kept per parameter (not per bucket) so that a rebuilt bucket layout still matches.
                for k, r in zip(ckeys, torch.split((x - own).detach(), cnumels)):
                    state.residuals[k] = r
            _scatter_runs(buf, cruns, mean.to(buf.dtype))
        state._finish_pending()
        return _completed(buf)
    finally:
        state._pending = None    # only left over when an error is on its way out
        state._stats.hook_s += time.perf_counter() - t_enter
        if bucket.is_last():
            state._end_step()


def _ring_allreduce_bytes(nbytes: int, p: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``nbytes``: ``2 (p-1)/p n`` (Patarasuk & Yuan 2009)."""
    return 0 if p == 1 else int(round(2 * (p - 1) * nbytes / p))


__all__ = ["QSGDState", "qsgd_hook", "TRANSPORTS"]

"""The collectives of one :class:`qsgd.QSGDState` in flight: issued in order, finished in callbacks.

Each bucket the hook receives runs as a *program*, a generator that does local work and yields
the collectives of its :class:`qsgd.WirePlan`, in plan order:

- ``yield Issue(name, tensor, start)`` hands the process group a collective (``start()`` issues
  it with ``async_op=True`` and returns the Work) and resumes the program once the collective
  is done, on the stream's callback thread (one per state, programs one at a time; see
  :meth:`Stream.defer`); with ``wait=False`` it resumes at once with a handle, and a later
  ``yield Join(handle)`` waits for that collective.
- Its return value completes the bucket's future.

gloo and NCCL match collectives across ranks by the order in which each rank issues them, and
callbacks run on whichever thread finishes a collective; so :class:`Stream` issues the requests
strictly in (bucket, step of its plan) order, whichever thread makes them: a bucket's
collectives go out only after every collective of the buckets handed over before it, and each
only once the one before it is done (one stream). The first
failure (a collective that errs, a program that raises) is kept as a :class:`qsgd.HookError`,
stops all further issues, and fails every unfinished bucket, so nothing waits for a collective
that will never be issued.

:meth:`Stream.finish_step` is what runs at the end of backward (an autograd engine callback,
queued before DDP's own): it waits, bounded by ``timeout_s``, for the step's buckets and raises
the failure as a :class:`qsgd.HookError` in the training thread. That is the only blocking wait,
and DDP would wait there anyway for the buckets' futures.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from qsgd.errors import HookError
from qsgd.wireplan import DTYPE_BYTES, wire_bytes

_TORCH_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                 torch.float64: "float64", torch.uint8: "uint8", torch.int64: "int64"}


@dataclass
class Issue:
    """A collective a program asks for: ``start()`` issues it (async) and returns its Work."""

    name: str
    tensor: torch.Tensor
    start: Callable[[], Any]
    wait: bool = True

    def ordered_start(self) -> Callable[[], Any]:
        """``start``, made to run after the kernels that produced ``tensor``. The collective
        may be issued from another thread than the one that queued them (whichever thread
        frees the stream), and a process group orders its work after the *issuing* thread's
        current CUDA stream only; an event recorded here bridges the two streams."""
        if not self.tensor.is_cuda:
            return self.start
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.tensor.device))
        start = self.start

        def after_ready():
            torch.cuda.current_stream(self.tensor.device).wait_event(ready)
            return start()
        return after_ready


@dataclass
class Join:
    """Wait for a collective issued earlier with ``Issue(..., wait=False)``."""

    handle: "Handle"


@dataclass
class Handle:
    """One collective of a bucket: what was sent and when (``time.perf_counter`` seconds)."""

    name: str
    op: str
    dtype: str
    nbytes: int
    issued: float | None = None
    done: float | None = None
    waiter: "Runner | None" = None

    def record(self) -> dict:
        return {"name": self.name, "op": self.op, "dtype": self.dtype, "nbytes": self.nbytes,
                "issued": self.issued, "done": self.done}


@dataclass
class StepStats:
    """What one backward's buckets did (see ``QSGDState.last_stats``)."""

    payload_bytes: int = 0
    raw_bytes: int = 0
    bytes_sent: int = 0
    encode_s: float = 0.0
    decode_s: float = 0.0
    hook_s: float = 0.0
    wait_s: float = 0.0
    buckets: int = 0
    timeline: list = field(default_factory=list)
    payload_sizes: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["timeline"] = [dict(r) for r in self.timeline]
        d["payload_sizes"] = dict(self.payload_sizes)
        return d


class Runner:
    """One bucket's program on a :class:`Stream`.

    ``record`` (a dict in the step's timeline) gets the hook's entry (``called``), each stage's
    ``[start, end]`` under ``stages``, each collective under ``collectives`` and the end
    (``done``), all ``time.perf_counter()`` seconds.
    """

    def __init__(self, stream: "Stream", ticket: int, program, plan, what: str, stats: StepStats,
                 record: dict, device: torch.device, deferred: bool = True):
        self.stream, self.ticket, self.program, self.plan = stream, ticket, program, plan
        self.what, self.stats, self.record = what, stats, record
        self.result = (torch.futures.Future(devices=[device]) if device.type == "cuda"
                       else torch.futures.Future())
        self.settled = False
        self.next_collective = 0
        # (0-d bool device tensor, () -> message) of checks left on the device; read by
        # Stream.finish_step, or at once when ``deferred`` is False (no end of backward to wait at)
        self.checks: list = []
        self.deferred = deferred
        record.setdefault("stages", {})
        record.setdefault("collectives", [])

    # --- local work -----------------------------------------------------------------------
    def stage(self, name: str) -> "_StageTimer":
        """``with runner.stage("encode"): ...`` times local work into the record and the stats."""
        return _StageTimer(self, name)

    def check(self, flag: torch.Tensor, describe) -> None:
        """A device-side check (True = fine): read at the end of backward, where the training
        thread waits anyway, so that a CUDA bucket never waits for its device in between."""
        if self.deferred:
            self.checks.append((flag, describe))
        elif not bool(flag):
            raise HookError(f"{self.what}: {_described(describe)}")

    # --- the program ----------------------------------------------------------------------
    def advance(self, value=None) -> None:
        """Run the program until it waits for a collective, or ends."""
        while True:
            try:
                req = self.program.send(value)
            except StopIteration as stop:
                self._settle(stop.value)
                return
            except HookError as exc:
                self.stream.fail(exc)
                return
            except Exception as exc:  # a bug or a bad payload: every rank must hear of it
                self.stream.fail(HookError(f"{self.what}: {type(exc).__name__}: {exc}"))
                return
            if isinstance(req, Join):
                with self.stream.lock:
                    if req.handle.done is None:
                        req.handle.waiter = self
                        return
                value = None
                continue
            handle = self._handle(req)
            if handle is None:
                return
            if req.wait:
                handle.waiter = self
                self.stream.submit(self, handle, req.ordered_start())
                return
            self.stream.submit(self, handle, req.ordered_start())
            value = handle

    def _handle(self, req: Issue) -> Handle | None:
        """Check a requested collective against the bucket's wire plan."""
        t = req.tensor
        dtype = _TORCH_DTYPES.get(t.dtype, str(t.dtype))
        nbytes = t.numel() * DTYPE_BYTES.get(dtype, t.element_size())
        planned = self.plan.collectives
        k = self.next_collective
        if k >= len(planned):
            self.stream.fail(HookError(f"{self.what}: the hook issues {req.name!r} beyond its wire "
                                       f"plan's {len(planned)} collectives"))
            return None
        c = planned[k]
        if (req.name, dtype) != (c.name, c.dtype) or (c.exact and nbytes != c.nbytes):
            self.stream.fail(HookError(
                f"{self.what}: collective {k} is {req.name!r} of {nbytes} bytes {dtype}, but the "
                f"wire plan says {c.name!r} of {c.nbytes} bytes {c.dtype}"))
            return None
        self.next_collective += 1
        handle = Handle(req.name, c.op, dtype, nbytes)
        self.record["collectives"].append(handle)
        with self.stream.lock:
            self.stats.bytes_sent += wire_bytes(c.op, nbytes, self.plan.world_size)
        return handle

    def completed(self, handle: Handle, fut) -> None:
        """The completion callback of ``handle``'s collective (any thread)."""
        now = time.perf_counter()
        try:
            fut.value()
        except Exception as exc:
            self.stream.fail(HookError(f"{self.what}: {handle.name} failed or timed out: {exc}"))
            return
        with self.stream.lock:
            handle.done = now
            waiter, handle.waiter = handle.waiter, None
            self.stream.busy = False
        self.stream._pump()
        if waiter is not None:
            self.stream.defer(lambda: _resume(waiter, fut))

    def _settle(self, value) -> None:
        self.record["done"] = time.perf_counter()
        with self.stream.lock:
            if self.settled:
                return
            self.settled = True
            self.stream.live.discard(self)
            self.stream.cond.notify_all()
        self.result.set_result(value)

    def fail(self, exc: HookError) -> None:
        """Fail the bucket's future (called by :meth:`Stream.fail`, lock held)."""
        if not self.settled:
            self.settled = True
            self.result.set_exception(exc)


class _StageTimer:
    def __init__(self, runner: Runner, name: str):
        self.runner, self.name = runner, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.c0 = time.thread_time()
        return self

    def __exit__(self, *exc):
        t1 = time.perf_counter()
        cpu = time.thread_time() - self.c0
        r = self.runner
        span = r.record["stages"].setdefault(self.name, [self.t0, t1])
        span[1] = t1
        # CPU seconds of this thread: the stage's own work, whoever else shared the cores
        cpus = r.record.setdefault("stages_cpu", {})
        cpus[self.name] = cpus.get(self.name, 0.0) + cpu
        with r.stream.lock:
            if self.name == "encode":
                r.stats.encode_s += t1 - self.t0
            else:
                r.stats.decode_s += t1 - self.t0
        return False


def _described(describe) -> str:
    """What a failed device-side check says; a failure to say it still ends as a HookError."""
    try:
        return describe()
    except Exception as exc:
        return f"a device-side check failed ({type(exc).__name__} while describing it: {exc})"


def _resume(runner: Runner, fut) -> None:
    # wait() on a done future makes this thread's current CUDA stream wait for the events of
    # the collective's stream (it does not block the host), so the program's next kernels read
    # the received bytes after they land; a no-op on CPU
    fut.wait()
    runner.advance()


def _callback_worker(callbacks: queue.SimpleQueue, numba_threads: int) -> None:
    import numba

    # numba's thread count is per thread (a new one gets every core): the codec's kernels
    # here must run as wide as in the thread that made the state (the harness gives each of
    # 4 ranks on 2 cores one thread; with 2, 4 decodes of 1M elements took 33 ms, not 11)
    numba.set_num_threads(numba_threads)
    while True:
        fn = callbacks.get()
        if fn is None:
            return
        fn()
        # drop it now: held while waiting, it would be freed by the next get(), which at
        # interpreter exit cannot take the GIL to free its tensors (the process aborted)
        del fn


class Stream:
    """Issues a state's collectives in (bucket ticket, plan step) order, from any thread."""

    def __init__(self):
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.counts: dict[int, int] = {}      # ticket -> collectives in its plan
        self.queued: dict[tuple, tuple] = {}  # (ticket, k) -> (runner, handle, start)
        self.head = (0, 0)
        self.tickets = 0
        self.gate: int | None = None           # tickets after it wait until it opens
        # One collective at a time, as on NCCL's one stream per communicator: gloo would run
        # two at once on its two worker threads, each at half the link rate, so that the
        # first bucket's payload arrived as late as the second's (measured: the decodes
        # started later and the step ended 10% later on 4 ranks at 200 Mbit/s).
        self.busy = False
        self.failure: HookError | None = None
        self.live: set[Runner] = set()
        self._callbacks: queue.SimpleQueue | None = None
        import numba

        self._numba_threads = numba.get_num_threads()

    def defer(self, fn) -> None:
        """Run ``fn`` on this stream's callback thread, after the ones deferred before it.

        Completion callbacks run on whichever thread finished the collective: for gloo one of
        its two worker threads, which then cannot move the next collective's bytes while it
        decodes (measured on 4 ranks: the stream paced at a decode per bucket instead of the
        link rate). So the programs continue here, one at a time, and the backend's threads
        only move bytes.
        """
        with self.lock:
            if self._callbacks is None:
                self._callbacks = queue.SimpleQueue()
                worker = threading.Thread(target=_callback_worker,
                                          args=(self._callbacks, self._numba_threads),
                                          name="qsgd-callbacks", daemon=True)
                worker.start()
                # the thread ends with the stream (it holds only the queue); not at interpreter
                # exit, where a daemon thread may no longer take the GIL
                weakref.finalize(self, self._callbacks.put, None).atexit = False
        self._callbacks.put(fn)

    def ticket(self, collectives: int) -> int:
        """A place in the issue order for a bucket with ``collectives`` collectives."""
        with self.lock:
            t = self.tickets
            self.tickets += 1
            self.counts[t] = collectives
            return t

    def start(self, runner: Runner) -> None:
        with self.lock:
            self.live.add(runner)
        runner.advance()
        with self.lock:
            self._skip_empty()
        self._pump()

    def submit(self, runner: Runner, handle: Handle, start) -> None:
        with self.lock:
            self.queued[(runner.ticket, runner.next_collective - 1)] = (runner, handle, start)
        self._pump()

    def open_gate(self) -> None:
        with self.lock:
            self.gate = None
        self._pump()

    def _skip_empty(self) -> None:
        t, k = self.head
        while t in self.counts and k >= self.counts[t]:
            del self.counts[t]
            t, k = t + 1, 0
        self.head = (t, k)

    def _pump(self) -> None:
        """Issue every queued collective whose turn it is; attach callbacks outside the lock."""
        started = []
        with self.lock:
            while self.failure is None and not self.busy:
                self._skip_empty()
                if self.gate is not None and self.head[0] > self.gate:
                    break
                item = self.queued.pop(self.head, None)
                if item is None:
                    break
                runner, handle, start = item
                handle.issued = time.perf_counter()
                try:
                    work = start()
                except Exception as exc:
                    self.fail(HookError(f"{runner.what}: issuing {handle.name} failed: {exc}"))
                    break
                self.head = (self.head[0], self.head[1] + 1)
                self.busy = True
                started.append((runner, handle, work))
        for runner, handle, work in started:
            work.get_future().add_done_callback(
                lambda fut, runner=runner, handle=handle: runner.completed(handle, fut))

    def fail(self, exc: HookError) -> None:
        """Keep the first failure; stop issuing; fail every unfinished bucket."""
        with self.lock:
            if self.failure is None:
                self.failure = exc
            self.queued.clear()
            for runner in list(self.live):
                runner.fail(self.failure)
            self.live.clear()
            self.cond.notify_all()

    def finish_step(self, runners: list[Runner], timeout_s: float, what: str) -> float:
        """Wait until ``runners`` are done (or a failure, or ``timeout_s``); seconds waited.

        Raises the failure as a :class:`HookError`.
        """
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        with self.lock:
            while self.failure is None and not all(r.settled for r in runners):
                left = deadline - time.perf_counter()
                if left <= 0:
                    pending = [h.name for r in runners if not r.settled
                               for h in r.record["collectives"] if h.done is None]
                    self.fail(HookError(f"{what}: collectives not done {timeout_s:g} s after "
                                        f"backward ended (timeout_s): {pending or 'none issued'}"))
                    break
                self.cond.wait(left)
            failure = self.failure
        if failure is None:
            failure = self._verify(runners)
        if failure is not None:
            raise HookError(str(failure)) from failure
        return time.perf_counter() - t0

    def _verify(self, runners: list[Runner]) -> HookError | None:
        """Read the runners' device-side checks: one read for all of them (on CUDA, the step's
        one host synchronisation); the first failed one, described, fails the stream."""
        checks = [(r, flag, describe) for r in runners for flag, describe in r.checks]
        for r in runners:
            r.checks = []
        if not checks or bool(torch.stack([flag.to(checks[0][1].device) for _, flag, _ in checks]).all()):
            return None
        for r, flag, describe in checks:
            if not bool(flag):
                self.fail(HookError(f"{r.what}: {_described(describe)}"))
                return self.failure
        return None

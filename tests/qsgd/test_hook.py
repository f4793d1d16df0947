"""The QSGD DDP hook on real gloo process groups: 4 ranks, and 2-rank subgroups of them.

One launch of 4 processes runs every scenario (process start-up dominates on 2 cores); each rank
writes its findings to a file and the tests below assert on them. What the hook hands the
process group is read back from the process group itself: PyTorch's flight recorder
(``TORCH_FR_BUFFER_SIZE``) records every collective gloo is given, with its input sizes and
dtypes. The destructive scenarios come last: a rank of the 4 dies (SIGKILL), a rank of a pair
stalls past ``timeout_s``, and a rank of another pair dies; the others must raise HookError
within the timeout, not hang.
"""
from __future__ import annotations

import copy
import hashlib
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from datetime import timedelta

import pytest
import torch

import qsgd

WORLD = 4
KILL_TIMEOUT_S = 8.0
STALL_TIMEOUT_S = 2.0
MIN_NUMEL = 500
FR_OPS = {"gloo:all_gather": "allgather", "gloo:all_to_all": "alltoall", "gloo:all_reduce": "allreduce"}
FR_BYTES = {"Byte": 1, "Half": 2, "Float": 4, "Long": 8, "Double": 8}


def _model(seed=0, width=96):
    torch.manual_seed(seed)
    # weight 32x96 (3072 el.) and 96x10 (960 el.) are compressed with min_numel=500; biases are not.
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))


def _deep(seed=0):
    # 4 layers of 65 792 elements: with 0.25 MiB buckets, one layer per bucket after DDP's
    # rebuild (a bucket closes once it reaches the cap; the first iteration has one bucket)
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])


def _batch(rank, step, n=8, features=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, features, generator=g), torch.randint(0, 10, (n,), generator=g)


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _step(ddp, opt, rank, step, features=32, group=False, delay_s=0.0):
    """One training step; with ``group`` (None: the default group), returns what backward handed gloo (the hook's
    collectives: DDP's own, such as its bucket rebuild, happen in forward)."""
    x, y = _batch(rank, step, features=features)
    out = ddp(x)
    loss = torch.nn.functional.cross_entropy(out[:, :10], y)
    opt.zero_grad()
    time.sleep(delay_s)
    before = len(_fr_entries(group)) if group is not False else 0
    loss.backward()
    opt.step()
    return _sent(_fr_entries(group)[before:]) if group is not False else None


def _fr_entries(group) -> list[dict]:
    """The flight recorder's entries of ``group``, oldest first."""
    import torch._C._distributed_c10d as c10d

    name = (group or torch.distributed.group.WORLD).group_name
    entries = pickle.loads(c10d._dump_fr_trace())["entries"]
    return [e for e in entries if e["process_group"][0] == name]


def _sent(entries) -> list[tuple]:
    """(op, dtype name, bytes) of each collective handed to gloo."""
    out = []
    for e in entries:
        (size,), (dtype,) = e["input_sizes"], e["input_dtypes"]
        n = 1
        for d in size:
            n *= d
        out.append((FR_OPS.get(e["profiling_name"], e["profiling_name"]), dtype, n * FR_BYTES[dtype]))
    return out


def _recording_hook(log):
    """Wraps qsgd_hook: records each bucket's local input, the future's state when the hook
    returns, and (in a callback) the averaged output.

    Also records the documented layout: the compressed coordinates are the parameters with
    >= min_numel elements, concatenated in the order the hook first met the parameters.
    """
    seen = {}

    def hook(state, bucket):
        local = bucket.buffer().clone()
        step, index = state.step, bucket.index()
        params = bucket.parameters()
        for p in params:
            seen.setdefault(id(p), len(seen))
        offsets = torch.cumsum(torch.tensor([0] + [p.numel() for p in params]), 0).tolist()
        big = sorted((seen[id(p)], o, p.numel()) for p, o in zip(params, offsets)
                     if p.numel() >= state.min_numel)
        cidx = torch.cat([torch.arange(o, o + n) for _, o, n in big])
        raw = torch.ones(local.numel(), dtype=torch.bool)
        raw[cidx] = False
        numels = tuple(p.numel() for p in params)
        fut = qsgd.qsgd_hook(state, bucket)
        done_at_return = fut.done()

        def record(f):
            out = f.value()
            log.append((step, index, local, out.clone(), cidx, raw, numels, done_at_return))
            # in completion order, which differs across ranks: sorted as DDP hands them over
            log.sort(key=lambda e: e[:2])
            return out
        return fut.then(record)
    # DDP checks the return annotation object (this module's annotations are strings).
    hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
    return hook


def _planned(log, state, transport, cfg, world, step, payloads=None):
    """The wire plan of every bucket of ``step``, in the order the hook got them."""
    out = []
    for s, index, _, _, _, _, numels, _ in log:
        if s != step:
            continue
        layout = qsgd.BucketLayout.by_size(numels, state.min_numel)
        pb = None if payloads is None else payloads[index]
        out += [(c.op, c.dtype, c.nbytes) for c in
                qsgd.wire_plan(transport, layout, world, cfg, payload_bytes=pb).collectives]
    return out


_FR_DTYPES = {"uint8": "Byte", "float16": "Half", "float32": "Float", "int64": "Long"}


def _scenario_mean(rank, world, group, transport, codec="packed", model=_model, features=32):
    """The hook's output equals the mean of qsgd.decode of every rank's payload; and what it
    handed gloo (the flight recorder's count) is its buckets' wire plans."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = model()
    ddp = DDP(net, process_group=group, bucket_cap_mb=0.25)
    cfg = qsgd.QSGDConfig.from_bits(4, codec=codec)
    state = qsgd.QSGDState(cfg, transport=transport, min_numel=MIN_NUMEL, seed=7, process_group=group)
    log = []
    ddp.register_comm_hook(state, _recording_hook(log))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sent = [_step(ddp, opt, rank, s, features, group) for s in range(3)]
    # per bucket of the last step, every rank's payload size (elias: the plan pads to the largest)
    mine = {r["bucket"]: [c["nbytes"] for c in r["collectives"]] for r in state.last_stats["timeline"]}
    every = [None] * world
    torch.distributed.all_gather_object(every, state.last_stats["payload_sizes"], group=group)
    payloads = {k: [e[k] for e in every] for k in every[0]}
    max_err, max_raw_err = 0.0, 0.0
    for step, index, local, out, cidx, raw, _, _ in log:
        locals_ = [None] * world
        torch.distributed.all_gather_object(locals_, local, group=group)
        if transport == "allgather":
            payloads_ = [qsgd.encode(l[cidx], cfg, 7, rank=r, step=step, bucket=index)
                         for r, l in enumerate(locals_)]
            expect = torch.stack([qsgd.decode(p) for p in payloads_]).sum(0) / world
            max_err = max(max_err, float((out[cidx] - expect).abs().max()))
        else:
            # Two quantizations: bounded by both rounds' steps (scale / s each, max norm).
            exact = torch.stack([l[cidx] for l in locals_]).mean(0)
            bound = 2.5 * float(max(l[cidx].abs().max() for l in locals_)) / cfg.levels
            max_err = max(max_err, float((out[cidx] - exact).abs().max()) / bound)
        raw_mean = torch.stack([l[raw] for l in locals_]).mean(0)
        max_raw_err = max(max_raw_err, float((out[raw] - raw_mean).abs().max()))
    planned = _planned(log, state, transport, cfg, world, 2,
                       None if codec == "packed" else payloads)
    return {"digest": _digest(net), "max_err": max_err, "max_raw_err": max_raw_err,
            "stats": state.last_stats, "steps": state.step, "sent": sent[2],
            "planned": [(op, _FR_DTYPES[d], n) for op, d, n in planned],
            "buckets": len({i for s, i, *_ in log if s == 2}), "mine": mine,
            "done_at_return": [d for s, *_, d in log if s >= 1]}


ASYNC_DELAY_S = 0.3


def _scenario_async(rank, world, group):
    """A 1M-element bucket: the hook returns before its collective is done, and backward runs
    on while it is in flight. The other ranks start each backward ``ASYNC_DELAY_S`` late (after
forward, where DDP's bucket rebuild syncs the ranks), so
    rank 0's collectives cannot be done before they arrive: a hook that waited would return
    done, after the delay."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    ddp = DDP(net, process_group=group, bucket_cap_mb=2)
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), min_numel=MIN_NUMEL, process_group=group)
    log = []
    ddp.register_comm_hook(state, _recording_hook(log))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    timelines = []
    for s in range(3):
        _step(ddp, opt, rank, s, features=64, delay_s=ASYNC_DELAY_S if rank else 0.0)
        timelines.append(state.last_stats["timeline"])
    return {"done_at_return": [(s, i, out.numel(), d) for s, i, _, out, *_, d in log],
            "timelines": timelines, "digest": _digest(net)}


def _scenario_resume(rank, world, group):
    """A checkpoint taken mid-run (error feedback on) resumes to the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def make():
        model = _model()
        ddp = DDP(model, process_group=group)
        state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(2, codec="elias"), min_numel=MIN_NUMEL,
                               seed=3, error_feedback=True, warmup_steps=1, process_group=group)
        ddp.register_comm_hook(state, qsgd.qsgd_hook)
        return model, ddp, state, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, ddp, state, opt = make()
    for s in range(3):
        _step(ddp, opt, rank, s)
    ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                          "hook": state.state_dict()})
    for s in range(3, 6):
        _step(ddp, opt, rank, s)
    straight = _digest(model)
    model2, ddp2, state2, opt2 = make()
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    state2.load_state_dict(ckpt["hook"])
    for s in range(3, 6):
        _step(ddp2, opt2, rank, s)
    return {"straight": straight, "resumed": _digest(model2), "residuals": len(ckpt["hook"]["residuals"]),
            "ckpt_step": ckpt["hook"]["step"]}


def _failure(fn):
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "is_hook_error": isinstance(exc, qsgd.HookError),
                "message": str(exc), "elapsed_s": time.monotonic() - t0}
    return {"type": None, "elapsed_s": time.monotonic() - t0}


def _scenario_mismatch(rank, world, group, odd_rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), process_group=group)
    bits = 2 if rank == odd_rank else 4
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(bits), min_numel=MIN_NUMEL, process_group=group)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    return _failure(lambda: _step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), rank, 0))


def _scenario_kill(rank, world, group, victim, timeout_s=KILL_TIMEOUT_S, stall_s=0.0):
    """``victim`` dies (SIGKILL) after one step, or with ``stall_s`` sleeps that long instead."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), process_group=group)
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), min_numel=MIN_NUMEL, timeout_s=timeout_s,
                           process_group=group)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    # two steps: DDP rebuilds its buckets in the second forward (a broadcast of its own)
    _step(ddp, opt, rank, 0)
    _step(ddp, opt, rank, 1)
    if rank == victim:
        if not stall_s:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(stall_s)
        return {"type": None, "victim": True}
    time.sleep(0.5)

    def steps():
        for s in range(2, 5):
            _step(ddp, opt, rank, s)
    return _failure(steps)


def _dump(out, path):
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(out, fh)
    os.replace(path + ".tmp", path)


def _worker(rank, world, port, outdir):
    out = {}
    path = os.path.join(outdir, f"rank{rank}.pkl")
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="20000")
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world,
                                             timeout=timedelta(seconds=30))
        pairs = [torch.distributed.new_group([0, 1]) for _ in range(4)]
        out["mean_allgather"] = _scenario_mean(rank, world, None, "allgather")
        out["mean_sra"] = _scenario_mean(rank, world, None, "scatter_reduce_allgather")
        # elias sizes depend on the data: exchanged before the payloads
        out["mean_allgather_elias"] = _scenario_mean(rank, world, None, "allgather", "elias")
        out["mean_sra_elias"] = _scenario_mean(rank, world, None, "scatter_reduce_allgather", "elias")
        out["deep_allgather"] = _scenario_mean(rank, world, None, "allgather", model=_deep,
                                               features=256)
        out["async"] = _scenario_async(rank, world, None)
        if rank < 2:
            out["mean_pair"] = _scenario_mean(rank, 2, pairs[0], "scatter_reduce_allgather")
            out["deep_pair"] = _scenario_mean(rank, 2, pairs[0], "allgather", model=_deep,
                                              features=256)
            out["async_pair"] = _scenario_async(rank, 2, pairs[0])
            out["resume"] = _scenario_resume(rank, 2, pairs[0])
            out["mismatch_pair"] = _scenario_mismatch(rank, 2, pairs[1], odd_rank=1)
        torch.distributed.barrier()
        out["mismatch"] = _scenario_mismatch(rank, world, None, odd_rank=2)
        torch.distributed.barrier()
        # written before each destructive scenario, so a victim or a hang keeps the rest
        _dump(out, path)
        out["kill"] = _scenario_kill(rank, world, None, victim=3)
        _dump(out, path)
        if rank < 2:
            out["stall_pair"] = _scenario_kill(rank, 2, pairs[2], victim=1, timeout_s=STALL_TIMEOUT_S,
                                               stall_s=4 * STALL_TIMEOUT_S)
            _dump(out, path)
            out["kill_pair"] = _scenario_kill(rank, 2, pairs[3], victim=1)
    except BaseException:
        out["error"] = traceback.format_exc()
    _dump(out, path)
    os._exit(0)  # the groups are broken after the kills; skip their teardown


def spawn_ranks(worker, world: int, outdir: str, timeout_s: float, extra: tuple = ()) -> list:
    """Run ``worker(rank, *extra, port, outdir)`` in ``world`` spawned processes, kill what is
    still alive after ``timeout_s`` seconds, and return each rank's pickled result dict."""
    from testbench.training.launch import free_port

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, *extra, port, outdir)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    results = []
    for r in range(world):
        with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as fh:
            results.append(pickle.load(fh))
    return results


def end_rank(out: dict, outdir: str, rank: int) -> None:
    """A spawned rank's last act: its results where :func:`spawn_ranks` reads them, then exit
    without the process groups' teardown."""
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump(out, fh)
    os._exit(0)


def checked_ranks(worker, world: int, outdir: str, timeout_s: float) -> list:
    """:func:`spawn_ranks`, failing the test with the first rank's traceback."""
    results = spawn_ranks(worker, world, outdir, timeout_s)
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    results = spawn_ranks(_worker, WORLD, str(tmp_path_factory.mktemp("hook")), 400,
                          extra=(WORLD,))
    for r, res in enumerate(results[:3]):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results


MEANS = ["mean_allgather", "mean_sra", "mean_allgather_elias", "mean_sra_elias", "deep_allgather"]


@pytest.mark.slow
@pytest.mark.parametrize("key, world", [(k, 4) for k in MEANS] + [("mean_pair", 2), ("deep_pair", 2)])
def test_every_rank_ends_with_identical_parameters(ranks, key, world):
    rs = [r for r in ranks if key in r]
    assert len(rs) == world
    assert len({r[key]["digest"] for r in rs}) == 1
    assert all(r[key]["steps"] == 3 for r in rs)


@pytest.mark.slow
@pytest.mark.parametrize("key, world", [(k, 4) for k in MEANS] + [("mean_pair", 2), ("deep_pair", 2)])
def test_the_wire_plan_is_what_the_process_group_was_given(ranks, key, world):
    for r in [r for r in ranks if key in r]:
        res = r[key]
        if key == "mean_sra_elias":
            # chunk payload sizes of the elias codec are estimated pro rata: ops and types only
            assert [s[:2] for s in res["sent"]] == [s[:2] for s in res["planned"]]
        else:
            assert res["sent"] == res["planned"], key
        assert res["stats"]["bytes_sent"] > 0
    if key.startswith("deep"):
        # DDP's rebuilt buckets: one 256x256 layer each (0.25 MiB cap)
        assert ranks[0][key]["buckets"] == 4
        # one collective at a time, buckets in order: each goes out once the one before is done
        for r in ranks[:world]:
            colls = [c for rec in sorted(r[key]["stats"]["timeline"], key=lambda b: b["bucket"])
                     for c in rec["collectives"]]
            assert len(colls) == 4
            assert all(a["done"] <= b["issued"] for a, b in zip(colls, colls[1:]))


@pytest.mark.slow
def test_allgather_result_is_the_mean_of_the_decoded_payloads(ranks):
    cfg = qsgd.QSGDConfig.from_bits(4)
    for r in ranks:
        for key in ("mean_allgather", "mean_allgather_elias", "deep_allgather"):
            assert r[key]["max_err"] <= 1e-6 and r[key]["max_raw_err"] <= 1e-6, key
        stats = r["mean_allgather"]["stats"]
        # 3072 + 960 compressed coordinates at 4 bits and the biases (106) in fp32, all in
        # one all_gather to 3 peers
        nbytes = qsgd.payload_nbytes(3072 + 960, cfg)
        assert stats["payload_bytes"] == nbytes
        assert stats["bytes_sent"] == 3 * (nbytes + 106 * 4)
        assert stats["raw_bytes"] == 106 * 4 and stats["encode_s"] > 0 and stats["decode_s"] > 0
        (rec,) = stats["timeline"]
        (coll,) = rec["collectives"]
        assert coll["name"] == "payload all_gather" and coll["nbytes"] == nbytes + 106 * 4
        enc, dec = rec["stages"]["encode"], rec["stages"]["decode"]
        # encode in the hook, the collective, decode in its callback, in that order
        assert rec["called"] <= enc[0] < enc[1] <= coll["issued"] < coll["done"] <= dec[0] < dec[1]
        assert dec[1] <= rec["done"]
        # elias: a size all_gather before the payloads
        names = [c["name"] for c in r["mean_allgather_elias"]["stats"]["timeline"][0]["collectives"]]
        assert names == ["size all_gather", "payload all_gather"]
        # scatter-reduce-allgather: the biases' allreduce is issued first and runs under the encode
        sra = r["mean_sra"]["stats"]["timeline"][0]
        names = [c["name"] for c in sra["collectives"]]
        assert names == ["small-tensor allreduce", "chunk all_to_all", "mean chunk all_gather"]
        assert sra["collectives"][0]["issued"] <= sra["stages"]["encode"][0]
        assert all(a["issued"] <= b["issued"] for a, b in zip(sra["collectives"], sra["collectives"][1:]))


@pytest.mark.slow
@pytest.mark.parametrize("key, world", [("async", 4), ("async_pair", 2)])
def test_the_future_is_not_done_when_the_hook_returns(ranks, key, world):
    rs = [r for r in ranks if key in r]
    assert len(rs) == world and len({r[key]["digest"] for r in rs}) == 1
    r = rs[0]
    big = [(s, i, done) for s, i, n, done in r[key]["done_at_return"] if n >= 1_000_000]
    assert len(big) == 3 and not any(done for *_, done in big)
    for tl in r[key]["timelines"][1:]:
        # DDP's rebuilt buckets: the 1M-element layer in the first, a 2 MiB bucket
        rec = next(b for b in tl if b["collectives"][-1]["nbytes"] > 400_000)
        done = rec["collectives"][-1]["done"]
        # the hook returned long before its payload came back: it did not wait for the peers
        assert rec["returned"] - rec["called"] < ASYNC_DELAY_S / 2 < done - rec["returned"]
        # and backward went on: the next bucket was handed over while the payload was away
        later = [b["called"] for b in tl if b["called"] > rec["called"]]
        assert later and min(later) < done


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 2])
def test_mismatched_settings_fail_on_every_rank_naming_the_field(ranks, world):
    key = "mismatch" if world == 4 else "mismatch_pair"
    rs = [r for r in ranks if key in r]
    assert len(rs) == world
    for r in rs:
        m = r[key]
        assert m["is_hook_error"], m
        assert "config.bits" in m["message"] and m["elapsed_s"] < 20


@pytest.mark.slow
@pytest.mark.parametrize("key, survivors, timeout_s", [("kill", 3, KILL_TIMEOUT_S),
                                                       ("kill_pair", 1, KILL_TIMEOUT_S),
                                                       ("stall_pair", 1, STALL_TIMEOUT_S)])
def test_a_dead_or_stalled_peer_makes_the_others_raise_hook_error_in_time(ranks, key, survivors,
                                                                          timeout_s):
    for rank, r in enumerate(ranks[:survivors]):
        k = r[key]
        assert k["is_hook_error"], f"rank {rank}: {k}"
        assert k["elapsed_s"] < timeout_s + 5, k
    if key == "kill":
        assert "kill" not in ranks[3]        # rank 3 really died
    if key == "stall_pair":
        assert "backward ended" in ranks[0][key]["message"]   # the hook's own bound, not gloo's 30 s


def test_state_validates_its_fields():
    cfg = qsgd.QSGDConfig.from_bits(4)
    with pytest.raises(qsgd.ConfigError, match="transport"):
        qsgd.QSGDState(cfg, transport="ring")
    with pytest.raises(qsgd.ConfigError, match="min_numel"):
        qsgd.QSGDState(cfg, min_numel=-1)
    with pytest.raises(qsgd.ConfigError, match="timeout_s"):
        qsgd.QSGDState(cfg, timeout_s=0)
    with pytest.raises(qsgd.ConfigError, match="config"):
        qsgd.QSGDState({"levels": 7})


def test_load_state_dict_refuses_another_config():
    a = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4))
    b = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(8))
    with pytest.raises(qsgd.HookError, match="'config'"):
        b.load_state_dict(a.state_dict())
    sd = a.state_dict()
    sd["step"] = -2
    with pytest.raises(qsgd.HookError, match="step"):
        a.load_state_dict(sd)

"""The QSGD DDP hook on real gloo process groups (4 ranks, and a 2-rank subgroup of them).

One launch of 4 processes runs every scenario (process start-up dominates on 2 cores); each rank
writes its findings to a file and the tests below assert on them. The last scenario kills rank 3
with SIGKILL mid-run: the survivors must raise HookError within the timeout, not hang.
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


def _model(seed=0, width=96):
    torch.manual_seed(seed)
    # weight 32x96 (3072 el.) and 96x10 (960 el.) are compressed with min_numel=500; biases are not.
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))


def _batch(rank, step, n=8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def _step(ddp, opt, rank, step):
    x, y = _batch(rank, step)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _recording_hook(log):
    """Wraps qsgd_hook and records each bucket's local input and averaged output.

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
        fut = qsgd.qsgd_hook(state, bucket)
        log.append((step, index, local, fut.value().clone(), cidx, raw))
        return fut
    # DDP checks the return annotation object (this module's annotations are strings).
    hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
    return hook


def _scenario_mean(rank, world, group, transport, codec="packed"):
    """The hook's output equals the mean of qsgd.decode of every rank's payload."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model()
    ddp = DDP(model, process_group=group)
    cfg = qsgd.QSGDConfig.from_bits(4, codec=codec)
    state = qsgd.QSGDState(cfg, transport=transport, min_numel=500, seed=7, process_group=group)
    log = []
    ddp.register_comm_hook(state, _recording_hook(log))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(3):
        _step(ddp, opt, rank, s)
    max_err, max_raw_err = 0.0, 0.0
    for step, index, local, out, cidx, raw in log:
        locals_ = [None] * world
        torch.distributed.all_gather_object(locals_, local, group=group)
        if transport == "allgather":
            payloads = [qsgd.encode(l[cidx], cfg, 7, rank=r, step=step, bucket=index)
                        for r, l in enumerate(locals_)]
            expect = torch.stack([qsgd.decode(p) for p in payloads]).sum(0) / world
            max_err = max(max_err, float((out[cidx] - expect).abs().max()))
        else:
            # Two quantizations: bounded by both rounds' steps (scale / s each, max norm).
            exact = torch.stack([l[cidx] for l in locals_]).mean(0)
            bound = 2.5 * float(max(l[cidx].abs().max() for l in locals_)) / cfg.levels
            max_err = max(max_err, float((out[cidx] - exact).abs().max()) / bound)
        raw_mean = torch.stack([l[raw] for l in locals_]).mean(0)
        max_raw_err = max(max_raw_err, float((out[raw] - raw_mean).abs().max()))
    return {"digest": _digest(model), "max_err": max_err, "max_raw_err": max_raw_err,
            "stats": state.last_stats, "steps": state.step}


def _scenario_resume(rank, world, group):
    """A checkpoint taken mid-run (error feedback on) resumes to the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def make():
        model = _model()
        ddp = DDP(model, process_group=group)
        state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(2, codec="elias"), min_numel=500, seed=3,
                               error_feedback=True, warmup_steps=1, process_group=group)
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


def _scenario_mismatch(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model())
    bits = 2 if rank == 2 else 4
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(bits), min_numel=500)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    t0 = time.monotonic()
    try:
        _step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), rank, 0)
    except Exception as exc:
        return {"type": type(exc).__name__, "is_hook_error": isinstance(exc, qsgd.HookError),
                "message": str(exc), "elapsed_s": time.monotonic() - t0}
    return {"type": None}


def _scenario_kill(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model())
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), min_numel=500, timeout_s=KILL_TIMEOUT_S)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    _step(ddp, opt, rank, 0)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        for s in range(1, 4):
            _step(ddp, opt, rank, s)
    except Exception as exc:
        return {"type": type(exc).__name__, "is_hook_error": isinstance(exc, qsgd.HookError),
                "message": str(exc), "elapsed_s": time.monotonic() - t0}
    return {"type": None}


def _worker(rank, world, port, outdir):
    out = {}
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world,
                                             timeout=timedelta(seconds=30))
        pair = torch.distributed.new_group([0, 1])
        out["mean_allgather"] = _scenario_mean(rank, world, None, "allgather")
        out["mean_sra"] = _scenario_mean(rank, world, None, "scatter_reduce_allgather")
        # elias sizes depend on the data: exchanged before the payloads
        out["mean_allgather_elias"] = _scenario_mean(rank, world, None, "allgather", "elias")
        out["mean_sra_elias"] = _scenario_mean(rank, world, None, "scatter_reduce_allgather",
                                               "elias")
        if rank < 2:
            out["mean_pair"] = _scenario_mean(rank, 2, pair, "scatter_reduce_allgather")
            out["resume"] = _scenario_resume(rank, 2, pair)
        torch.distributed.barrier()
        out["mismatch"] = _scenario_mismatch(rank, world)
        torch.distributed.barrier()
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as fh:
            pickle.dump(out, fh)  # written before the kill, so a hang there keeps the rest
        out["kill"] = _scenario_kill(rank, world)
    except BaseException:
        out["error"] = traceback.format_exc()
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump(out, fh)
    os._exit(0)  # the group is broken after the kill; skip its teardown


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from testbench.training.launch import free_port

    outdir = str(tmp_path_factory.mktemp("hook"))
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, WORLD, port, outdir)) for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    results = []
    for r in range(WORLD):
        path = os.path.join(outdir, f"rank{r}.pkl")
        with open(path, "rb") as fh:
            results.append(pickle.load(fh))
    for r, res in enumerate(results[:3]):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results


@pytest.mark.slow
@pytest.mark.parametrize("key", ["mean_allgather", "mean_sra", "mean_allgather_elias",
                                 "mean_sra_elias"])
def test_every_rank_ends_with_identical_parameters(ranks, key):
    digests = {r[key]["digest"] for r in ranks}
    assert len(digests) == 1
    assert all(r[key]["steps"] == 3 for r in ranks)


@pytest.mark.slow
def test_allgather_result_is_the_mean_of_the_decoded_payloads(ranks):
    for r in ranks:
        assert r["mean_allgather"]["max_err"] <= 1e-6
        assert r["mean_allgather"]["max_raw_err"] <= 1e-6
        stats = r["mean_allgather"]["stats"]
        # 3072 + 960 compressed coordinates at 4 bits and the biases (106) in fp32, all in
        # one all_gather to 3 peers
        nbytes = qsgd.payload_nbytes(3072 + 960, qsgd.QSGDConfig.from_bits(4))
        assert stats["payload_bytes"] == nbytes
        assert stats["bytes_sent"] == 3 * (nbytes + 106 * 4)
        assert stats["raw_bytes"] == 106 * 4 and stats["encode_s"] > 0 and stats["decode_s"] > 0
        # one collective per bucket (packed sizes are known to every rank), waited for at once
        (issued, start, end), = stats["waits"]
        assert issued == start < end and end - start == pytest.approx(stats["comm_s"], rel=1e-9)
        assert stats["hook_s"] > stats["comm_s"] + stats["encode_s"]
        # elias payload sizes depend on the data: all-gathered before the payloads
        elias = r["mean_allgather_elias"]
        assert elias["max_err"] <= 1e-6 and elias["max_raw_err"] <= 1e-6
        assert len(elias["stats"]["waits"]) == 2
        # scatter-reduce-allgather sends the biases by an allreduce issued before the encode
        # and waited for after it, then the chunk all_to_all and the mean chunks' all_gather
        sra = r["mean_sra"]["stats"]
        waits = sra["waits"]
        assert len(waits) == 3 and all(i <= a < b for i, a, b in waits)
        assert waits[0][1] - waits[0][0] > 0 and waits[1][0] == waits[1][1]
        assert all(waits[j][2] <= waits[j + 1][0] for j in range(2))
        assert sra["bytes_sent"] > round(2 * 3 * 106 * 4 / 4)


@pytest.mark.slow
@pytest.mark.parametrize("key, world", [("mean_sra", 4), ("mean_pair", 2), ("mean_sra_elias", 4)])
def test_scatter_reduce_allgather_is_close_to_the_exact_mean(ranks, key, world):
    rs = [r for r in ranks if key in r]
    assert len(rs) == world and len({r[key]["digest"] for r in rs}) == 1
    for r in rs:
        assert r[key]["max_err"] <= 1.0  # within 2.5 quantization steps of the exact mean
        assert r[key]["max_raw_err"] <= 1e-6


@pytest.mark.slow
def test_checkpoint_resumes_to_the_same_parameters(ranks):
    for r in ranks[:2]:
        res = r["resume"]
        assert res["ckpt_step"] == 3 and res["residuals"] >= 1
        assert res["resumed"] == res["straight"]
    assert ranks[0]["resume"]["straight"] == ranks[1]["resume"]["straight"]


@pytest.mark.slow
def test_config_mismatch_fails_on_every_rank_naming_the_field(ranks):
    for r in ranks:
        m = r["mismatch"]
        assert m["is_hook_error"], m
        assert "config.bits" in m["message"] and m["elapsed_s"] < 20


@pytest.mark.slow
def test_killed_peer_makes_the_others_raise_within_the_timeout(ranks):
    for rank, r in enumerate(ranks[:3]):
        k = r["kill"]
        assert k["type"] is not None, f"rank {rank} did not notice the dead peer"
        assert k["elapsed_s"] < KILL_TIMEOUT_S + 10
    # Rank 3 really died: it never wrote its kill result.
    assert "kill" not in ranks[3]


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

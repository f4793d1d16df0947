"""The hook's device path (the packed codec with its checks left on the device, what a CUDA
bucket runs), on three real gloo ranks with the path forced on CPU tensors: the same parameters
as the host path bit for bit, for both transports, and every rank raising HookError on a
corrupt payload or a non-finite gradient, at the end of backward."""
from __future__ import annotations

import hashlib
import os
import traceback
from datetime import timedelta

import pytest
import torch

import qsgd
from tests.qsgd.test_hook import MIN_NUMEL, _deep, _digest, _failure, _step, checked_ranks, end_rank

WORLD = 3     # three ranks: scatter-reduce-allgather's chunks differ in size


def _train(rank, transport, device_path: bool, steps=3, corrupt_rank=None, nan_rank=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from qsgd import _programs, devicecodec

    net = _deep()
    ddp = DDP(net, bucket_cap_mb=0.25)
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport=transport, min_numel=MIN_NUMEL,
                           seed=5)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    on_device, encode = _programs._Bucket.on_device, devicecodec.encode
    if device_path:
        _programs._Bucket.on_device = lambda self: self.cfg.codec == "packed"
    if rank == corrupt_rank:
        def damaged(*args, **kwargs):
            payload, finite = encode(*args, **kwargs)
            payload[len(payload) // 2] ^= 0x40
            return payload, finite
        devicecodec.encode = damaged
    try:
        def run():
            for s in range(steps):
                if rank == nan_rank and s == steps - 1:
                    with torch.no_grad():
                        net[0].weight[0, 0] = float("nan")      # every gradient NaN from here
                _step(ddp, opt, rank, s, features=256)
        failure = _failure(run)
    finally:
        _programs._Bucket.on_device, devicecodec.encode = on_device, encode
    return {"digest": _digest(net), "steps": state.step, "failure": failure}


def _worker(rank, port, outdir):
    out = {}
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD,
                                             timeout=timedelta(seconds=30))
        for transport in ("allgather", "scatter_reduce_allgather"):
            out[f"host {transport}"] = _train(rank, transport, False)
            out[f"device {transport}"] = _train(rank, transport, True)
            torch.distributed.barrier()
        out["corrupt"] = _train(rank, "allgather", True, steps=2, corrupt_rank=1)
        torch.distributed.barrier()
        out["nan"] = _train(rank, "allgather", True, steps=2, nan_rank=2)
    except BaseException:
        out["error"] = traceback.format_exc()
    end_rank(out, outdir, rank)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return checked_ranks(_worker, WORLD, str(tmp_path_factory.mktemp("device")), 240)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["allgather", "scatter_reduce_allgather"])
def test_device_path_trains_exactly_as_the_host_path(ranks, transport):
    digests = {r[f"{kind} {transport}"]["digest"] for r in ranks for kind in ("host", "device")}
    assert len(digests) == 1
    for r in ranks:
        for kind in ("host", "device"):
            assert r[f"{kind} {transport}"]["failure"]["type"] is None
            assert r[f"{kind} {transport}"]["steps"] == 3


@pytest.mark.slow
def test_a_corrupt_payload_is_a_hook_error_on_every_rank(ranks):
    for r in ranks:
        f = r["corrupt"]["failure"]
        assert f["is_hook_error"], f
        assert "does not decode" in f["message"] and "CRC-32 mismatch" in f["message"], f["message"]


@pytest.mark.slow
def test_a_non_finite_gradient_is_a_hook_error_on_every_rank(ranks):
    # the rank with NaN gradients reads its own finiteness flag; its peers find its payload's
    # NaN scale when they decode it
    for r, res in enumerate(ranks):
        f = res["nan"]["failure"]
        assert f["is_hook_error"], f
        if r == 2:
            assert "the gradient is not finite: x holds" in f["message"], f["message"]
        else:
            assert "does not decode" in f["message"] and "invalid scale" in f["message"], f["message"]


def _cuda_worker(rank, port, outdir):
    # two gloo ranks sharing the one GPU (gloo moves CUDA tensors through the host; NCCL
    # would refuse two ranks on one device): the hook's CUDA path, collectives included
    out = {}
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=2,
                                             timeout=timedelta(seconds=60))
        for transport in ("allgather", "scatter_reduce_allgather"):
            net = _deep().cuda()
            ddp = DDP(net, device_ids=[0], bucket_cap_mb=0.25)
            state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport=transport,
                                   min_numel=MIN_NUMEL, seed=5)
            ddp.register_comm_hook(state, qsgd.qsgd_hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for s in range(3):
                g = torch.Generator().manual_seed(1000 * s + rank)
                x = torch.randn(8, 256, generator=g).cuda()
                ddp(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
            h = hashlib.sha256()
            for p in net.parameters():
                h.update(p.detach().cpu().numpy().tobytes())
            out[transport] = {"digest": h.hexdigest(), "steps": state.step,
                              "collectives": sum(len(r["collectives"])
                                                 for r in state.last_stats["timeline"])}
    except BaseException:
        out["error"] = traceback.format_exc()
    end_rank(out, outdir, rank)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ranks_end_identical(tmp_path):
    results = checked_ranks(_cuda_worker, 2, str(tmp_path), 240)
    for transport in ("allgather", "scatter_reduce_allgather"):
        assert results[0][transport]["digest"] == results[1][transport]["digest"]
        assert all(r[transport]["steps"] == 3 and r[transport]["collectives"] > 0 for r in results)

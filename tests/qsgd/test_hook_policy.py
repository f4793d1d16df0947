"""Per-layer bit widths in the hook (``QSGDState(bit_policy=...)``), on two real gloo ranks: the
ranks end identical, each bucket's payload is the size of its width, a policy that differs
across ranks is a HookError naming it; and the policy's own checks."""
from __future__ import annotations

import os
import traceback
from datetime import timedelta

import pytest
import torch

import qsgd
from tests.qsgd.test_hook import MIN_NUMEL, _deep, _digest, _failure, _step, checked_ranks, end_rank

WORLD = 2
#: one width per layer of ``_deep`` (each layer its own bucket after DDP's rebuild)
POLICY = {"0.weight": 2, "1.weight": 8, "2.weight": 3, "3.weight": 5}


def _scenario_mixed(rank, transport):
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = _deep()
    ddp = DDP(net, bucket_cap_mb=0.25)
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), transport=transport, min_numel=MIN_NUMEL, seed=3,
                           bit_policy=POLICY, model=net)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for s in range(3):
        _step(ddp, opt, rank, s, features=256)
    return {"digest": _digest(net), "steps": state.step,
            "payload_sizes": sorted(state.last_stats["payload_sizes"].values())}


def _scenario_mismatch(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = _deep()
    ddp = DDP(net, bucket_cap_mb=0.25)
    policy = dict(POLICY, **({"1.weight": 6} if rank == 1 else {}))
    state = qsgd.QSGDState(qsgd.QSGDConfig.from_bits(4), min_numel=MIN_NUMEL, bit_policy=policy, model=net)
    ddp.register_comm_hook(state, qsgd.qsgd_hook)
    return _failure(lambda: _step(ddp, torch.optim.SGD(net.parameters(), lr=0.1), rank, 0, features=256))


def _worker(rank, port, outdir):
    out = {}
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30))
        out["allgather"] = _scenario_mixed(rank, "allgather")
        out["sra"] = _scenario_mixed(rank, "scatter_reduce_allgather")
        torch.distributed.barrier()
        out["mismatch"] = _scenario_mismatch(rank)
    except BaseException:
        out["error"] = traceback.format_exc()
    end_rank(out, outdir, rank)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return checked_ranks(_worker, WORLD, str(tmp_path_factory.mktemp("policy")), 240)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["allgather", "sra"])
def test_mixed_widths_keep_ranks_identical_and_size_each_bucket_by_its_width(ranks, key):
    assert ranks[0][key]["digest"] == ranks[1][key]["digest"]
    assert all(r[key]["steps"] == 3 for r in ranks)
    n = 256 * 256
    if key == "allgather":
        want = sorted(qsgd.payload_nbytes(n, qsgd.QSGDConfig.from_bits(b)) for b in POLICY.values())
    else:   # p chunks of each bucket, one payload each
        want = sorted(sum(qsgd.payload_nbytes(c, qsgd.QSGDConfig.from_bits(b)) for c in (n // 2, n // 2))
                      for b in POLICY.values())
    for r in ranks:
        assert r[key]["payload_sizes"] == want


@pytest.mark.slow
def test_mismatched_policies_are_a_hook_error_on_every_rank(ranks):
    for r in ranks:
        m = r["mismatch"]
        assert m["is_hook_error"], m
        assert "bit_policy" in m["message"] and m["elapsed_s"] < 20


def test_policy_is_checked_against_the_model():
    net = _deep()
    cfg = qsgd.QSGDConfig.from_bits(4)
    with pytest.raises(qsgd.ConfigError, match=r"bit_policy: 'nope.weight' is not a parameter of the model"):
        qsgd.QSGDState(cfg, bit_policy={"nope.weight": 4}, model=net)
    with pytest.raises(qsgd.ConfigError, match=r"bit_policy\['0.weight'\]: expected an int in \[2, 16\], got 1"):
        qsgd.QSGDState(cfg, bit_policy={"0.weight": 1}, model=net)
    with pytest.raises(qsgd.ConfigError, match=r"model: a bit_policy needs the module DDP wraps"):
        qsgd.QSGDState(cfg, bit_policy={"0.weight": 4})
    s = qsgd.QSGDState(cfg, bit_policy=POLICY, model=net)
    assert s.state_dict()["bit_policy"] == dict(sorted(POLICY.items()))
    other = qsgd.QSGDState(cfg)
    with pytest.raises(qsgd.HookError, match=r"field 'bit_policy'"):
        other.load_state_dict(s.state_dict())

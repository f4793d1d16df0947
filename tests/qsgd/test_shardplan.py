"""Sharded wire plans: units, what each strategy sends per unit and phase, bytes, bad input."""
from __future__ import annotations

import math

import pytest

import qsgd
from qsgd.shardplan import ZERO_BUCKET_NUMEL, strategy

LLAMA = {"embed.weight": 32000 * 64, **{f"layers.{i}.{n}": k for i in range(3)
                                        for n, k in (("attn.q.weight", 4096), ("mlp.up.weight", 8192),
                                                     ("attn_norm.weight", 64))},
         "norm.weight": 64, "head.weight": 32000 * 64}


def _ops(steps, kind="collective"):
    return [s for s in steps if s.kind == kind]


def test_units_are_the_blocks_and_one_root_unit_first():
    units = qsgd.units_of(LLAMA)
    assert [u.name for u in units] == ["root", "layers.0", "layers.1", "layers.2"]
    assert units[0].root and not any(u.root for u in units[1:])
    assert units[0].params == ("embed.weight", "norm.weight", "head.weight")
    assert units[1].numel == 4096 + 8192 + 64
    assert sum(u.numel for u in units) == sum(LLAMA.values())
    # a model without numbered modules is one unit
    assert [u.name for u in qsgd.units_of({"w": 3, "b": 1})] == ["root"]


@pytest.mark.parametrize("p", [1, 3, 8])
def test_fsdp_gathers_twice_in_16_bits_and_reduce_scatters_in_the_grad_dtype(p):
    units = qsgd.units_of(LLAMA)
    plan = qsgd.shard_plan("fsdp", units, p, gather_bytes=2, reduce_bytes=4)
    for up, u in zip(plan.units, units):
        s = math.ceil(u.numel / p)
        assert up.shard_numel == s
        if p == 1:
            assert up.collectives == ()
            continue
        (fwd,) = up.forward
        assert (fwd.op, fwd.nbytes, fwd.wire_bytes) == ("allgather", 2 * s, (p - 1) * 2 * s)
        # the root unit stays gathered from forward to the end of backward
        assert up.backward == (() if u.root else up.forward)
        (rs,) = up.reduce
        assert (rs.op, rs.nbytes, rs.dtype) == ("reduce_scatter", 4 * p * s, "float32")
        assert rs.wire_bytes == round((p - 1) * 4 * s)
    assert plan.wire_bytes == sum(u.wire_bytes for u in plan.units)


def test_shard_grad_op_sends_no_backward_gather_and_zero3_reduces_in_16_bits():
    units = qsgd.units_of(LLAMA)
    full = qsgd.shard_plan("fsdp", units, 4)
    grad_op = qsgd.shard_plan("fsdp_grad_op", units, 4)
    assert all(u.backward == () for u in grad_op.units)
    saved = sum(c.wire_bytes for u in full.units for c in u.backward)
    assert full.wire_bytes - grad_op.wire_bytes == saved > 0
    z3 = qsgd.shard_plan("zero3", units, 4, reduce_bytes=2)
    assert {c.dtype for u in z3.units for c in u.reduce} == {"bfloat16"}


def test_hsdp_shards_within_a_machine_and_allreduces_the_shards_across():
    units = qsgd.units_of(LLAMA)
    plan = qsgd.shard_plan("hsdp", units, 16, shard_size=8)
    assert (plan.shard_size, plan.replicas) == (8, 2)
    u = plan.units[1]
    s = math.ceil(u.unit.numel / 8)
    rs, ar = u.reduce
    assert (rs.group, rs.op, rs.nbytes) == ("shard", "reduce_scatter", 4 * 8 * s)
    assert (ar.group, ar.op, ar.nbytes, ar.after) == ("replicate", "allreduce", 4 * s, 0)
    assert ar.wire_bytes == round(2 * (2 - 1) * 4 * s / 2)   # a ring allreduce over 2 machines
    # one machine: nothing to replicate
    assert all(s.group == "shard" for s in qsgd.shard_plan("hsdp", units, 8, shard_size=8).units[1].reduce)


def test_quantized_reduce_scatter_and_gathers_are_qsgd_payloads():
    g4, w8 = qsgd.QSGDConfig.from_bits(4), qsgd.QSGDConfig.from_bits(8)
    units = qsgd.units_of(LLAMA)
    p = 4
    plan = qsgd.shard_plan("fsdp", units, p, grads=g4, weights=w8)
    u = plan.units[2]
    s = u.shard_numel
    enc, a2a, red = u.reduce
    assert (enc.name, enc.runs_in, enc.encode_numel) == ("encode", "hook", p * s)
    assert (a2a.op, a2a.nbytes, a2a.after) == ("alltoall", p * qsgd.payload_nbytes(s, g4), 0)
    assert (red.runs_in, red.decode_numel, red.payloads, red.after) == ("callback", p * s, p, 1)
    wenc, ag, dec = u.forward
    assert (wenc.encode_numel, ag.op, ag.nbytes) == (s, "allgather", qsgd.payload_nbytes(s, w8))
    assert (dec.decode_numel, dec.payloads) == (p * s, p)
    dense = qsgd.shard_plan("fsdp", units, p)
    assert plan.wire_bytes < dense.wire_bytes / 3


def test_zero1_and_zero2_reduce_buckets_and_gather_the_updated_shards_after_the_step():
    buckets = [(("a",), 3 * 10**8, 0), (("b", "c"), 3 * 10**8, 10), (("d",), 10**6, 0)]
    units = qsgd.zero_buckets(buckets)
    assert [u.numel for u in units] == [6 * 10**8, 10**6] and units[0].raw_numel == 10
    assert ZERO_BUCKET_NUMEL == 5 * 10**8
    z1 = qsgd.shard_plan("zero1", units, 8, gather_bytes=2, reduce_bytes=4)
    (ar,) = z1.units[0].reduce
    assert (ar.op, ar.nbytes) == ("allreduce", 4 * 6 * 10**8)
    (ag,) = z1.units[0].step
    assert (ag.op, ag.nbytes) == ("allgather", 2 * math.ceil(6 * 10**8 / 8))
    assert z1.units[0].forward == z1.units[0].backward == ()
    z2 = qsgd.shard_plan("zero2", units, 8)
    assert [c.op for c in z2.units[0].collectives] == ["reduce_scatter", "allgather"]
    # ZeRO-1 reduces as DDP does, with DDP's QSGD transports too
    q = qsgd.shard_plan("zero1", units, 8, grads=qsgd.QSGDConfig.from_bits(4),
                        transport="allgather")
    assert [c.name for c in q.units[0].reduce if c.kind == "collective"] == ["payload all_gather"]


def test_registry_describes_each_strategy():
    assert list(qsgd.STRATEGIES) == ["ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp_grad_op",
                                     "hsdp"]
    assert not strategy("ddp").sharded and all(strategy(s).sharded for s in qsgd.STRATEGIES
                                               if s != "ddp")
    assert [s for s in qsgd.STRATEGIES if strategy(s).params_sharded] == \
        ["zero3", "fsdp", "fsdp_grad_op", "hsdp"]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(strategy_name="fsdp2"), "parallelism: 'fsdp2' is not one of"),
    (dict(strategy_name="ddp"), "'ddp' has no sharded plan"),
    (dict(strategy_name="hsdp", world_size=12, shard_size=8), "shard_size: 8 does not divide world_size=12"),
    (dict(strategy_name="fsdp", gather_bytes=3), "gather_bytes: expected 2 or 4"),
    (dict(strategy_name="fsdp", world_size=0), "world_size: expected an int >= 1"),
    (dict(strategy_name="fsdp", grads="4bit"), "grads: expected a QSGDConfig"),
])
def test_bad_input_is_one_line_naming_the_value(kwargs, needle):
    args = {"units": qsgd.units_of(LLAMA), "world_size": 8, **kwargs}
    with pytest.raises(qsgd.ConfigError) as exc:
        qsgd.shard_plan(**args)
    assert needle in str(exc.value) and "\n" not in str(exc.value)

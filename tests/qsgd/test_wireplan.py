"""The wire plan: collectives, bytes and order per transport, checked against real payloads.

(That the hook hands the process group exactly its plan is tested on real gloo ranks in
test_hook.py, read back from the process group's flight recorder.)
"""
import doctest

import pytest
import torch

import qsgd
import qsgd.wireplan
from qsgd.wireplan import SIZE_META_BYTES, chunk_numels

CFG4 = qsgd.QSGDConfig.from_bits(4)
MIXED = qsgd.BucketLayout.by_size((70_000, 300, 20_001, 17), min_numel=10_000)


def _order_ok(plan):
    # every step waits for an earlier one (or the hook's entry): a plan is a DAG in order
    return all(s.after is None or 0 <= s.after < i for i, s in enumerate(plan.steps))


def test_layout_totals_and_the_papers_rule():
    assert MIXED.compressed_numel == 90_001 and MIXED.raw_numel == 317
    assert MIXED.raw == (False, True, False, True) and MIXED.raw_nbytes == 4 * 317
    assert qsgd.BucketLayout.of(5, 0).numels == (5,)
    assert qsgd.BucketLayout.of(0, 7).raw == (True,)


def test_allgather_packed_is_one_collective_with_the_raw_tensors_in_front():
    for p in (2, 4, 16):
        plan = qsgd.wire_plan("allgather", MIXED, p, CFG4)
        (c,) = plan.collectives
        payload = qsgd.payload_nbytes(90_001, CFG4)
        assert (c.name, c.op, c.dtype, c.after) == ("payload all_gather", "allgather", "uint8", 0)
        assert c.nbytes == payload + 4 * 317 and c.exact
        assert c.wire_bytes == (p - 1) * c.nbytes == plan.wire_bytes
        enc, dec = plan.stages
        assert (enc.name, enc.runs_in, enc.encode_numel) == ("encode", "hook", 90_001)
        assert (dec.name, dec.runs_in, dec.payloads, dec.decode_numel) == ("decode", "callback", p, p * 90_001)
        assert dec.after == 1 and _order_ok(plan)


def test_allgather_payload_size_is_the_real_encoders():
    x = torch.randn(90_001, generator=torch.Generator().manual_seed(0))
    plan = qsgd.wire_plan("allgather", qsgd.BucketLayout.of(90_001, 0), 4, CFG4)
    assert plan.collectives[0].nbytes == qsgd.encode(x, CFG4, 0).numel()


def test_elias_pads_to_the_largest_rank_after_a_size_exchange():
    cfg = qsgd.QSGDConfig.from_bits(4, codec="elias")
    plan = qsgd.wire_plan("allgather", MIXED, 4, cfg, payload_bytes=[900, 1000, 950, 700])
    size, payload = plan.collectives
    assert (size.name, size.nbytes, size.dtype) == ("size all_gather", SIZE_META_BYTES, "int64")
    assert payload.nbytes == 1000 + 4 * 317 and not payload.exact and not plan.exact
    assert payload.after == 1 and size.after == 0
    with pytest.raises(qsgd.ConfigError, match="payload_bytes"):
        qsgd.wire_plan("allgather", MIXED, 4, cfg)
    with pytest.raises(qsgd.ConfigError, match="payload_bytes"):
        qsgd.wire_plan("allgather", MIXED, 4, cfg, payload_bytes=[1, 2])


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_scatter_reduce_allgather_chunks_are_the_real_encoders(p):
    plan = qsgd.wire_plan("scatter_reduce_allgather", MIXED, p, CFG4)
    names = [c.name for c in plan.collectives]
    assert names == ["small-tensor allreduce", "chunk all_to_all", "mean chunk all_gather"]
    small, a2a, mean = plan.collectives
    # the raw tensors' allreduce is issued on entry, before the encode it runs under
    assert small.after is None and small.nbytes == 4 * 317 and small.dtype == "float32"
    assert plan.steps.index(small) < plan.steps.index(plan.stages[0])
    x = torch.randn(90_001, generator=torch.Generator().manual_seed(1))
    chunks = torch.tensor_split(x, p)
    assert [c.numel() for c in chunks] == chunk_numels(90_001, p)
    sizes = [qsgd.encode(c, CFG4, 0).numel() for c in chunks]
    assert a2a.nbytes == sum(sizes) and mean.nbytes == max(sizes)
    assert a2a.wire_bytes == round((p - 1) * sum(sizes) / p)
    assert small.wire_bytes == round(2 * (p - 1) * 4 * 317 / p)
    reduce_ = next(s for s in plan.stages if s.name == "reduce")
    assert reduce_.runs_in == "callback" and reduce_.payloads == p
    assert _order_ok(plan)


def test_elias_scatter_reduce_allgather_exchanges_sizes_twice():
    cfg = qsgd.QSGDConfig.from_bits(2, codec="elias")
    plan = qsgd.wire_plan("scatter_reduce_allgather", qsgd.BucketLayout.of(40_000, 0), 4, cfg,
                          payload_bytes=8000)
    assert [c.name for c in plan.collectives] == ["chunk size all_to_all", "chunk all_to_all",
                                                  "mean chunk size all_gather", "mean chunk all_gather"]
    assert plan.collectives[0].nbytes == 8 * 4


def test_raw_only_buckets_and_one_rank():
    raw = qsgd.BucketLayout.of(0, 500)
    for t in ("allgather", "scatter_reduce_allgather"):
        (c,) = qsgd.wire_plan(t, raw, 4, CFG4).collectives
        assert (c.name, c.op, c.nbytes) == ("small-tensor allreduce", "allreduce", 2000)
        assert qsgd.wire_plan(t, raw, 1, CFG4).steps == ()
        one = qsgd.wire_plan(t, MIXED, 1, CFG4)
        assert one.collectives == () and all(s.runs_in == "hook" for s in one.stages)


@pytest.mark.parametrize("transport, width, dtype", [("fp32", 4, "float32"), ("fp16", 2, "float16")])
def test_dense_transports_are_one_allreduce(transport, width, dtype):
    (c,) = qsgd.wire_plan(transport, MIXED, 8, None).collectives
    assert (c.op, c.dtype, c.nbytes) == ("allreduce", dtype, width * MIXED.numel)
    assert c.wire_bytes == round(2 * 7 * c.nbytes / 8)
    assert qsgd.wire_plan(transport, MIXED, 8, CFG4).config is None


def test_bad_inputs_name_the_field():
    with pytest.raises(qsgd.ConfigError, match="transport"):
        qsgd.wire_plan("ring", MIXED, 4, CFG4)
    with pytest.raises(qsgd.ConfigError, match="config"):
        qsgd.wire_plan("allgather", MIXED, 4)
    with pytest.raises(qsgd.ConfigError, match="world_size"):
        qsgd.wire_plan("allgather", MIXED, 0, CFG4)
    with pytest.raises(qsgd.ConfigError, match="layout"):
        qsgd.wire_plan("allgather", (10, 20), 4, CFG4)
    with pytest.raises(qsgd.ConfigError, match="numels"):
        qsgd.BucketLayout((), ())
    with pytest.raises(qsgd.ConfigError, match="raw"):
        qsgd.BucketLayout((5, 6), (True,))
    with pytest.raises(qsgd.ConfigError, match="element_size"):
        qsgd.BucketLayout((5,), (True,), 3)
    with pytest.raises(qsgd.ConfigError, match="op"):
        qsgd.wireplan.wire_bytes("broadcast", 10, 4)


def test_plan_serialises_and_the_docstring_examples_run():
    d = qsgd.wire_plan("allgather", MIXED, 4, CFG4).to_dict()
    assert d["steps"][1]["kind"] == "collective" and d["config"]["bits"] == 4
    assert doctest.testmod(qsgd.wireplan).failed == 0

"""Compression as other projects implement it: PowerSGD's and GRACE's wire plans, their bytes
against hand counts from the sources, and their stages timed on a GPU."""
import math

import pytest

import emulator
import qsgd
import topologies
from emulator.compute import ComputeModel, device
from emulator.compute.methods import stage_seconds
from emulator.compute.timeline import HOST_OP_S
from qsgd.wiremethods import COMPRESSORS, CompressorConfig, PowerSGDConfig, tensor_payload_bytes

# a conv layer (64 x 3 x 3 x 3), its bias, a fully connected layer, its bias
SHAPES = ((64, 3, 3, 3), (64,), (1000, 2048), (1000,))
LAYOUT = qsgd.BucketLayout(tuple(math.prod(s) for s in SHAPES), (False,) * 4, shapes=SHAPES)


def _dag(plan):
    return all(s.after is None or 0 <= s.after < i for i, s in enumerate(plan.steps))


def test_layout_shapes_are_checked():
    with pytest.raises(qsgd.ConfigError, match=r"shapes\[1\]: .*product is numels\[1\]=64"):
        qsgd.BucketLayout((1728, 64), (False, False), shapes=((64, 27), (65,)))
    with pytest.raises(qsgd.ConfigError, match="shapes: expected one shape per tensor"):
        qsgd.BucketLayout((1728,), (False,), shapes=((64, 27), (1,)))


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_torch_powersgd_sends_the_factors_of_the_matrices_worth_compressing(rank):
    plan = qsgd.wire_plan("powersgd", LAYOUT, 8, PowerSGDConfig(rank=rank))
    # powerSGD_hook's _should_compress: (n + m) r * 2 < n m; 64 x 27 is worth it up to r = 14
    p_elems, q_elems = (64 + 1000) * rank, (27 + 2048) * rank
    names = [(c.name, c.op, c.nbytes) for c in plan.collectives]
    assert names == [("uncompressed allreduce", "allreduce", 4 * (64 + 1000)),
                     ("P allreduce", "allreduce", 4 * p_elems),
                     ("Q allreduce", "allreduce", 4 * q_elems)]
    assert [(s.name, s.runs_in) for s in plan.stages] == [
        ("encode", "hook"), ("unpack", "callback"), ("reduce", "callback"), ("decode", "callback")]
    assert _dag(plan) and plan.wire_bytes < qsgd.wire_plan("fp32", LAYOUT, 8).wire_bytes / 50


def test_torch_leaves_small_matrices_raw_grace_compresses_every_matrix():
    layout = qsgd.BucketLayout((12, 64), (False, False), shapes=((3, 4), (64,)))
    torch_plan = qsgd.wire_plan("powersgd", layout, 4, PowerSGDConfig(rank=2))
    assert [c.name for c in torch_plan.collectives] == ["uncompressed allreduce"]
    grace = qsgd.wire_plan("powersgd", layout, 4, PowerSGDConfig(rank=2, implementation="grace"))
    assert [(c.name, c.nbytes) for c in grace.collectives] == [
        ("uncompressed allreduce", 4 * 64), ("P allreduce", 4 * 3 * 2), ("Q allreduce", 4 * 4 * 2)]
    assert "unpack" not in [s.name for s in grace.stages]     # GRACE sums vectors in place


def test_powersgd_needs_shapes_and_one_rank_sends_nothing():
    with pytest.raises(qsgd.ConfigError, match="layout.shapes: PowerSGD compresses each tensor"):
        qsgd.wire_plan("powersgd", qsgd.BucketLayout.of(1000, 0), 4, PowerSGDConfig())
    plan = qsgd.wire_plan("powersgd", LAYOUT, 1, PowerSGDConfig())
    assert plan.collectives == () and [s.runs_in for s in plan.stages] == ["hook"] * 3


@pytest.mark.parametrize("cfg, value_bytes", [
    (CompressorConfig("qsgd", levels=64), 1), (CompressorConfig("qsgd", levels=128), 2),
    (CompressorConfig("8bit"), 1), (CompressorConfig("signsgd"), 1),
    (CompressorConfig("topk", ratio=0.01), 8), (CompressorConfig("dgc", ratio=0.1), 8)])
def test_grace_allgather_gathers_every_tensors_payload(cfg, value_bytes):
    plan = qsgd.wire_plan("grace_allgather", LAYOUT, 4, cfg)
    c = COMPRESSORS[cfg.family]
    kept = [n if c.kept == "all" else max(1, int(n * cfg.ratio)) for n in LAYOUT.numels]
    payload = sum(k * value_bytes + 4 * c.scalars for k in kept)
    gathers = plan.collectives
    assert gathers[-1].name == "payload all_gather" and gathers[-1].nbytes == payload
    assert gathers[-1].wire_bytes == 3 * payload
    # DGC's sizes differ across ranks: GRACE gathers them first (tensors_size_are_same=False)
    assert [g.name for g in gathers[:-1]] == (["size all_gather"] if cfg.family == "dgc" else [])
    dec = plan.stages[-1]
    assert (dec.name, dec.runs_in, dec.payloads, dec.decode_numel) == \
        ("decode", "callback", 4, 4 * LAYOUT.numel)


def test_grace_allreduce_sums_random_k_values_and_checks_the_communicator():
    plan = qsgd.wire_plan("grace_allreduce", LAYOUT, 4, CompressorConfig("randomk", ratio=0.1))
    (c,) = plan.collectives
    assert (c.op, c.nbytes) == ("allreduce", 4 * sum(max(1, int(n * 0.1)) for n in LAYOUT.numels))
    with pytest.raises(qsgd.ConfigError, match="randomk runs with GRACE's allreduce communicator"):
        qsgd.wire_plan("grace_allgather", LAYOUT, 4, CompressorConfig("randomk", ratio=0.1))


@pytest.mark.parametrize("kwargs, message", [
    (dict(family="zip"), "CompressorConfig.family: expected one of"),
    (dict(family="topk"), r"CompressorConfig.ratio: topk needs a share of the elements in \(0, 1\]"),
    (dict(family="topk", ratio=1.5), "CompressorConfig.ratio"),
    (dict(family="qsgd"), "CompressorConfig.levels: qsgd needs an int >= 1"),
])
def test_compressor_configs_say_what_is_wrong(kwargs, message):
    with pytest.raises(qsgd.ConfigError, match=message):
        CompressorConfig(**kwargs)


def test_threshold_payloads_cannot_be_planned_and_bad_powersgd_settings_fail():
    with pytest.raises(qsgd.ConfigError, match="threshold sends the values above a fixed"):
        tensor_payload_bytes(1000, CompressorConfig("threshold"))
    with pytest.raises(qsgd.ConfigError, match="PowerSGDConfig.rank: expected an int >= 1"):
        PowerSGDConfig(rank=0)
    with pytest.raises(qsgd.ConfigError, match="PowerSGDConfig.implementation"):
        PowerSGDConfig(implementation="tf")
    with pytest.raises(qsgd.ConfigError, match="config: transport 'powersgd' needs a PowerSGDConfig"):
        qsgd.wire_plan("powersgd", LAYOUT, 4, qsgd.QSGDConfig.from_bits(4))


def test_plans_serialise_with_their_config_and_shapes():
    d = qsgd.wire_plan("powersgd", LAYOUT, 4, PowerSGDConfig()).to_dict()
    assert d["config"]["method"] == "powersgd" and d["shapes"][2] == [1000, 2048]
    assert "shapes" not in qsgd.wire_plan("fp32", qsgd.BucketLayout.of(10, 0), 4).to_dict()


# ---------------------------------------------------------------- stages on a GPU
def test_grace_decode_grows_with_the_ranks_and_is_bounded_by_host_issue():
    v100 = device("V100")
    cfg = CompressorConfig("qsgd", levels=64)
    small = qsgd.BucketLayout((64,) * 100, (False,) * 100, shapes=((64,),) * 100)
    dec = {p: stage_seconds(plan, plan.stages[-1], v100)
           for p in (2, 4, 8) for plan in [qsgd.wire_plan("grace_allgather", small, p, cfg)]}
    assert dec[2] < dec[4] < dec[8]
    # 100 tiny tensors: every operator costs at least its host issue, whatever its bytes
    assert dec[8] >= 100 * 8 * 3 * HOST_OP_S


def test_error_feedback_costs_more_than_none_and_a_faster_gpu_less():
    big = qsgd.BucketLayout((2048 * 4608,), (False,), shapes=((2048, 4608),))
    plain = qsgd.wire_plan("grace_allgather", big, 8, CompressorConfig("8bit"))
    mem = qsgd.wire_plan("grace_allgather", big, 8, CompressorConfig("8bit", error_feedback=True))
    v100, h100 = device("V100"), device("H100-SXM")
    assert stage_seconds(mem, mem.stages[0], v100) > stage_seconds(plain, plain.stages[0], v100)
    assert stage_seconds(plain, plain.stages[0], h100) < stage_seconds(plain, plain.stages[0], v100)
    with pytest.raises(ValueError, match="no stage model for transport 'fp32'"):
        fp = qsgd.wire_plan("fp32", big, 8)
        stage_seconds(fp, plain.stages[0], v100)


# ---------------------------------------------------------------- replay and studies
@pytest.fixture(scope="module")
def resnet():
    return qsgd.measure("resnet50", qsgd.QSGDConfig.from_bits(4), device="meta")


def test_replay_times_powersgd_on_the_topologys_wire(resnet):
    G = topologies.from_spec("switch:8,bw=10Gbit")
    compute = ComputeModel.for_device("V100", resnet, batch_size=64, precision="fp32")
    fp32 = emulator.replay(resnet, G, transport="fp32", compute=compute)
    psgd = emulator.replay(resnet, G, transport="powersgd", compute=compute)
    assert psgd.bytes_per_gpu < fp32.bytes_per_gpu / 50 and psgd.encode_decode_s > 0
    assert psgd.exposed_comm_s < fp32.exposed_comm_s
    r4 = emulator.replay(resnet, G, transport="powersgd", compute=compute,
                         method=qsgd.PowerSGDConfig(rank=4))
    assert r4.bytes_per_gpu > psgd.bytes_per_gpu and r4.encode_decode_s > psgd.encode_decode_s


def test_method_transports_need_shapes_a_gpu_and_their_config(resnet):
    import dataclasses

    G = topologies.from_spec("switch:4,bw=10Gbit")
    compute = ComputeModel.for_device("V100", resnet, batch_size=64, precision="fp32")
    old = dataclasses.replace(resnet, buckets=tuple(dataclasses.replace(b, extra={})
                                                    for b in resnet.buckets))
    with pytest.raises(emulator.ConfigError, match="bucket 0 records no tensor shapes"):
        emulator.replay(old, G, transport="powersgd", compute=compute)
    with pytest.raises(emulator.ConfigError, match="needs a qsgd.CompressorConfig"):
        emulator.replay(resnet, G, transport="grace_allgather", compute=compute)
    with pytest.raises(emulator.ConfigError, match="takes no method config"):
        emulator.replay(resnet, G, transport="fp32", compute=compute, method=PowerSGDConfig())
    cpu = qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), iterations=1, batch_size=2,
                       device="cpu", seed=0)
    with pytest.raises(emulator.ConfigError, match="times its stages on a GPU"):
        emulator.replay(cpu, G, transport="powersgd")


def test_a_study_compares_powersgd_but_not_the_grace_transports(resnet):
    study = emulator.run_study(emulator.StudyConfig(
        trace=resnet, world_sizes=(8,), bits=(32, 16), transports=("fp32", "fp16", "powersgd"),
        topologies=("switch:{n},bw=10Gbit",), device="V100", batch_size=64, precision="fp32"))
    rows = {r.label: r for r in study.rows}
    assert set(rows) == {"fp32", "fp16", "powersgd"} and rows["powersgd"].bits == 32
    assert rows["powersgd"].speedup_vs_fp32 > 1
    assert emulator.StudyConfig(trace=resnet).transports == \
        ("fp32", "fp16", "qsgd_allgather", "qsgd_scatter_reduce_allgather")
    with pytest.raises(emulator.ConfigError, match="'grace_allgather' is not one of"):
        emulator.StudyConfig(trace=resnet, transports=("grace_allgather",))

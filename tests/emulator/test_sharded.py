"""The sharded replay, its servers, the memory model and sharded studies."""
from __future__ import annotations

import math

import pytest

import emulator
import qsgd
import topologies
from emulator import servers
from emulator.memory import check_fits, memory_per_gpu
from emulator.sharded import machine_size, replay_sharded, sharded_plan


@pytest.fixture(scope="module")
def trace():
    return qsgd.measure("gpt2", qsgd.QSGDConfig.from_bits(4), device="meta")


@pytest.fixture(scope="module")
def G():
    return topologies.from_spec("cluster:dgx_h100x2")


@pytest.fixture(scope="module")
def model(trace, G):
    return emulator.ComputeModel.for_topology(G, trace, batch_size=8)


# ---------------------------------------------------------------- servers
def test_servers_run_each_queue_in_order_and_wait_for_what_items_need():
    out = servers.run({"a": [servers.Item(1, 2.0), servers.Item(2, 1.0, (3,))],
                       "b": [servers.Item(3, 5.0), servers.Item(4, 1.0, (1,))]})
    assert out == {1: (0.0, 2.0), 3: (0.0, 5.0), 2: (5.0, 6.0), 4: (5.0, 6.0)}
    with pytest.raises(emulator.SimulationError, match="never runs"):
        servers.run({"a": [servers.Item(1, 1.0, (2,))], "b": [servers.Item(2, 1.0, (1,))]})


def test_a_running_collective_slows_the_paced_server_by_its_share():
    # the collective (share 0.25) runs 0-4 s; compute item "a" (3 s of work) at 0.75 until
    # 4 s does all of it by 4 s; "b" waits for "c" and runs alone at full pace
    q = {"compute": [servers.Item("a", 3.0), servers.Item("b", 2.0, ("c",))],
         "nccl": [servers.Item("c", 4.0, share=0.25)]}
    out = servers.run(q, paced="compute")
    assert out["a"] == pytest.approx((0.0, 4.0)) and out["b"] == pytest.approx((4.0, 6.0))
    # the same queues without pacing, or with no share, are the list schedule to the bit
    plain = servers.run(q)
    assert plain["a"] == (0.0, 3.0)
    no_share = {k: [servers.Item(i.key, i.seconds, i.after) for i in v] for k, v in q.items()}
    assert servers.run(no_share, paced="compute") == plain
    # two collectives at once on two servers add their shares (HSDP's two communicators)
    q2 = {"compute": [servers.Item("a", 1.0)], "s": [servers.Item("x", 10.0, share=0.3)],
          "r": [servers.Item("y", 10.0, share=0.2)]}
    assert servers.run(q2, paced="compute")["a"] == pytest.approx((0.0, 2.0))
    with pytest.raises(emulator.SimulationError, match=r"share=1\.0 must be in \[0, 1\)"):
        servers.run({"a": [servers.Item(1, 1.0, share=1.0)]})


def test_work_beside_compute_shares_its_sms_half_and_half():
    # a 2 s decode beside 3 s of compute: both at half pace for 4 s, then the compute's last
    # second alone (the DDP replay's callback stage beside backward, emulator/overlap.py)
    q = {"compute": [servers.Item("bwd", 3.0)], "side": [servers.Item("dec", 2.0)]}
    out = servers.run(q, paced="compute", beside="side", split=0.5)
    assert out["dec"] == pytest.approx((0.0, 4.0)) and out["bwd"] == pytest.approx((0.0, 5.0))
    from emulator import overlap
    ddp = overlap.run([overlap.Work("bwd", 3.0)], [overlap.Work("dec", 2.0)], [])
    assert [*out["dec"], *out["bwd"]] == pytest.approx([*ddp["dec"], *ddp["bwd"]])
    # a collective's share slows both; without sharing the list schedule
    q["nccl"] = [servers.Item("ag", 10.0, share=0.5)]
    out = servers.run(q, paced="compute", beside="side", split=0.5)
    assert out["dec"] == pytest.approx((0.0, 8.0)) and out["bwd"] == pytest.approx((0.0, 10.0))
    assert servers.run({k: v for k, v in q.items() if k != "nccl"})["bwd"] == (0.0, 3.0)


@pytest.mark.parametrize("seed", range(5))
def test_pacing_only_ever_delays_and_never_reorders(seed):
    import random

    rng = random.Random(seed)
    q = {"compute": [], "nccl": []}
    for k in range(12):
        after = (("n", k - 1),) if k and rng.random() < 0.5 else ()
        q["compute"].append(servers.Item(("c", k), rng.uniform(0, 2), after))
        q["nccl"].append(servers.Item(("n", k), rng.uniform(0, 2), (("c", k),),
                                      share=rng.uniform(0, 0.5)))
    plain, paced = servers.run(q), servers.run(q, paced="compute")
    assert all(paced[k][1] >= plain[k][1] - 1e-12 for k in plain)
    for name, items in q.items():          # each server in its order, one item at a time
        ends = [paced[i.key] for i in items]
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(ends, ends[1:]))


def test_nccl_kernels_take_one_sm_per_channel_from_the_compute(trace, G, model):
    net = emulator.Network(G)
    blocks = net.blocks("allgather", "nccl", 1 << 28)
    plan = emulator.collectives.nccl.plan(G, "allgather", 1 << 28)
    assert blocks == plan.channels > 0
    assert emulator.Network(G, algorithm="ring").blocks("allgather", "ring", 1 << 28) == 0
    assert model.sms == 132 and model.sm_share(blocks) == blocks / 132
    assert emulator.ComputeModel().sm_share(blocks) == 0.0      # measured seconds: no GPU
    # the replays slow compute while collectives run: the step is longer than with the
    # same collectives leaving every SM to compute, by less than their time
    pred = replay_sharded(trace, G, parallelism="fsdp", compute=model)
    assert pred.iteration_s > pred.compute_s + 1e-6
    ddp = emulator.replay(trace, G, compute=model)
    comm = sum(c[2] - c[1] for b in ddp.buckets for c in b.collectives)
    assert 0 < ddp.iteration_s - ddp.compute_s < comm


# ---------------------------------------------------------------- unit times
def test_units_compute_in_layer_order_and_the_optimizer_shrinks_with_its_shard(trace, model):
    units = qsgd.units_of(trace.operators.parameters)
    t = model.unit_times(trace, [u.params for u in units], shards=16)
    fwd, bwd, opt, _ = model.phases(trace)
    assert (t.forward_s, t.backward_s) == (fwd, bwd)
    blocks = range(1, len(units))
    assert all(t.forward_start[i] < t.forward_start[i + 1] for i in blocks[:-1])
    assert all(t.ready[i] > t.ready[i + 1] for i in blocks[:-1])        # backward runs in reverse
    assert all(t.backward_start[i] < t.ready[i] for i in blocks)
    assert t.ready[0] == max(t.ready)                                    # the embeddings last
    assert opt / 20 < t.optimizer_s < opt / 4
    assert model.unit_times(trace, [], shards=1).optimizer_s == opt


# ---------------------------------------------------------------- the replay
def test_fsdp_sends_its_plans_bytes_and_hides_them_behind_compute(trace, G, model):
    pred = replay_sharded(trace, G, parallelism="fsdp", compute=model)
    plan = sharded_plan(trace, "fsdp", 16, model)
    assert math.isclose(pred.bytes_per_gpu, plan.wire_bytes, rel_tol=1e-3)
    assert len(pred.buckets) == len(plan.units) == 13
    assert pred.compute_s == pytest.approx(model.unit_times(trace, []).forward_s
                                           + pred.backward_s + pred.optimizer_s)
    assert 0 < pred.exposed_comm_s < 0.1 * pred.iteration_s
    for b in pred.buckets[1:]:       # a block: two gathers, then its reduce-scatter
        names = [c[0] for c in b.collectives]
        assert names == ["forward parameter all_gather", "backward parameter all_gather",
                         "reduce gradient reduce_scatter"]
        starts = [c[1] for c in b.collectives]
        assert starts == sorted(starts) and b.collectives[2][1] >= b.ready_s


def test_without_compute_the_step_is_the_streams_collectives_end_to_end(trace, G, model):
    pred = replay_sharded(trace, G, parallelism="fsdp", compute=model.scaled(0.0))
    colls = sorted((c for b in pred.buckets for c in b.collectives), key=lambda c: c[1])
    assert pred.compute_s == 0
    # one stream: no two collectives overlap, and nothing waits between them
    assert all(a[2] <= b[1] + 1e-12 for a, b in zip(colls, colls[1:]))
    assert pred.iteration_s == pytest.approx(sum(c[2] - c[1] for c in colls))


def test_strategies_differ_as_their_plans_say(trace, G, model):
    run = {s: replay_sharded(trace, G, parallelism=s, compute=model)
           for s in ("fsdp", "fsdp_grad_op", "zero2", "zero3", "hsdp")}
    backward = sum(c[2] - c[1] for b in run["fsdp"].buckets for c in b.collectives
                   if c[0].startswith("backward"))
    assert backward > 0 and run["fsdp_grad_op"].bytes_per_gpu < run["fsdp"].bytes_per_gpu
    # HSDP: the reduce-scatter inside a machine, then the shards' allreduce across the two
    names = {c[0] for b in run["hsdp"].buckets for c in b.collectives}
    assert "reduce shard allreduce" in names
    # ZeRO-2: DDP's buckets reduce-scattered, the updated shards gathered after the step
    z2 = run["zero2"]
    assert all(c[0].startswith(("reduce", "step")) for b in z2.buckets for c in b.collectives)
    assert max(c[2] for b in z2.buckets for c in b.collectives) == pytest.approx(z2.iteration_s)


def test_a_slower_network_costs_a_sharded_step_more(trace, model):
    fast = topologies.from_spec("cluster:dgx_h100x2")
    slow = topologies.from_spec("cluster:dgx_h100x2,nic_bw=10Gbit")
    a = replay_sharded(trace, fast, parallelism="fsdp", compute=model)
    b = replay_sharded(trace, slow, parallelism="fsdp", compute=model)
    assert b.exposed_comm_s > 5 * a.exposed_comm_s and b.bytes_per_gpu == a.bytes_per_gpu


def test_quantized_reduce_scatter_and_gathers_cut_the_bytes_and_cost_codec_time(trace, G, model):
    dense = replay_sharded(trace, G, parallelism="fsdp", compute=model)
    q = replay_sharded(trace, G, parallelism="fsdp", compute=model, weight_bits=8, bits=4,
                       transport="qsgd_scatter_reduce_allgather")
    assert q.bytes_per_gpu < 0.4 * dense.bytes_per_gpu
    assert q.encode_decode_s > 0 and q.bits == 4
    assert "parameter gathers quantized to 8 bits" in q.source
    # a free codec leaves only the smaller collectives
    free = replay_sharded(trace, G, parallelism="fsdp", compute=model.scaled(1.0, 0.0),
                          weight_bits=8, bits=4, transport="qsgd_scatter_reduce_allgather")
    assert free.encode_decode_s == 0 and free.iteration_s <= dense.iteration_s + 1e-9


@pytest.mark.parametrize("kwargs, needle", [
    (dict(parallelism="fsdp", transport="qsgd_allgather"),
     "transport 'qsgd_allgather' does not reduce-scatter; with parallelism='fsdp' use one of"),
    (dict(parallelism="fsdp3"), "parallelism: 'fsdp3' is not one of"),
    (dict(parallelism="hsdp", shard_size=3), "a shard group of 3 GPUs does not divide world_size=16"),
    (dict(parallelism="ddp"), "replays with emulator.replay"),
])
def test_bad_replay_settings_are_one_line(trace, G, model, kwargs, needle):
    with pytest.raises(emulator.ConfigError) as exc:
        replay_sharded(trace, G, compute=model, **kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_machine_size_reads_the_gpus_hosts(G):
    assert machine_size(G) == 8
    assert machine_size(topologies.from_spec("dgx_a100")) == 8


# ---------------------------------------------------------------- memory
def test_memory_per_gpu_follows_each_strategys_sharding(trace):
    m = {s: memory_per_gpu(trace, s, 16, precision="amp-bf16", batch_size=8, shard_size=8)
         for s in qsgd.STRATEGIES}
    n = trace.parameters
    states = {s: v.parameters + v.gradients + v.optimizer for s, v in m.items()}
    # ZeRO, Section 5.1: (2 + 2 + K) n, (2 + 2) n + K n / p, 2 n + (2 + K) n / p, (4 + K) n / p
    assert states["zero1"] == pytest.approx(4 * n + 12 * n / 16)
    assert states["zero2"] == pytest.approx(2 * n + 14 * n / 16)
    assert states["zero3"] == pytest.approx(16 * n / 16)
    assert states["ddp"] == pytest.approx(16 * n)              # fp32 weights, grads, 2 moments
    assert states["fsdp"] == pytest.approx(16 * n / 16)
    assert states["hsdp"] == pytest.approx(16 * n / 8)
    assert len({v.activations for v in m.values()}) == 1       # no strategy changes them
    ops = trace.operators.family("amp")
    assert m["fsdp"].activations == ops.saved[0] + 8 * ops.saved[1]
    assert m["fsdp_grad_op"].buffers > m["fsdp"].buffers       # every block stays gathered
    assert m["ddp"].total > m["zero1"].total > m["zero2"].total > m["zero3"].total


def test_a_float16_model_keeps_float32_master_weights_in_its_optimizer_state(trace):
    trace = qsgd.add_operators(trace, families=("half",))
    n = trace.parameters
    ddp = memory_per_gpu(trace, "ddp", 16, precision="fp16", batch_size=8)
    fsdp = memory_per_gpu(trace, "fsdp", 16, precision="fp16", batch_size=8)
    # ZeRO, Section 3.1: 2 bytes of weight, 2 of gradient, K = 12 of master weight and moments
    assert (ddp.parameters, ddp.gradients, ddp.optimizer) == pytest.approx((2 * n, 2 * n, 12 * n))
    assert fsdp.parameters + fsdp.gradients + fsdp.optimizer == pytest.approx(16 * n / 16)
    assert ddp.buffers == pytest.approx(2 * n)                 # DDP's buckets hold float16
    ops = trace.operators.family("half")
    assert ddp.activations == ops.saved[0] + 8 * ops.saved[1]


def test_a_model_that_does_not_fit_even_fully_sharded_is_refused(trace):
    dev = emulator.compute.device("H100")
    fits = check_fits(trace, "fsdp", [8, 16], precision="amp-bf16", batch_size=8, device=dev)
    assert all(m.fits for m in fits.values())
    with pytest.raises(emulator.ConfigError) as exc:
        check_fits(trace, "fsdp", [8, 64], precision="amp-bf16", batch_size=512, device=dev)
    msg = str(exc.value)
    assert "parallelism='fsdp': gpt2 at batch 512 per GPU needs" in msg and "H100-SXM's 80 GiB (85.9 GB)" in msg
    assert "no world size of the study fits" in msg and "\n" not in msg


# ---------------------------------------------------------------- studies
def test_a_sharded_study_reports_its_strategy_and_memory(trace):
    cfg = emulator.StudyConfig(trace=trace, world_sizes=(8, 16), bits=(32, 16, 4),
                               topologies=("cluster:dgx_h100x{N}",), batch_size=8,
                               parallelism="fsdp", weight_bits=8)
    assert cfg.transports == ("fp32", "fp16", "qsgd_scatter_reduce_allgather")
    study = emulator.run_study(cfg)
    assert {r.parallelism for r in study.rows} == {"fsdp"}
    assert all(r.memory_per_gpu and r.memory_per_gpu < 80e9 for r in study.rows)
    assert [r.label for r in study.rows[:4]] == ["fp32", "fp16", "qsgd_scatter_reduce_allgather 16-bit",
                                                 "qsgd_scatter_reduce_allgather 4-bit"]
    assert study.config["parallelism"] == "fsdp" and study.config["weight_bits"] == 8
    assert "strategy" in study.table() and "GB/GPU" in study.table()
    one = replay_sharded(trace, emulator.topology_for("cluster:dgx_h100x{N}", 16),
                         parallelism="fsdp", compute=emulator.resolve_compute(cfg)[cfg.topologies[0]])
    assert study.cell(cfg.topologies[0], 16)[0].iteration_s == one.iteration_s


def test_a_study_read_back_keeps_strategy_and_memory_and_older_rows_read_as_ddp(trace, tmp_path):
    study = emulator.run_study(emulator.StudyConfig(
        trace=trace, world_sizes=(8,), bits=(32,), transports=("fp32",),
        topologies=("cluster:dgx_h100x{N}",), batch_size=8, parallelism="zero2"))
    study.save_json(tmp_path / "s.json")
    back = emulator.read_study(tmp_path / "s.json")
    assert back.rows == study.rows and back.rows[0].parallelism == "zero2"
    old = {k: v for k, v in study.rows[0].to_dict().items() if k not in ("parallelism", "memory_per_gpu")}
    row = emulator.StudyRow.from_dict(old)
    assert (row.parallelism, row.memory_per_gpu) == ("ddp", None)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(parallelism="fsdp2"), "StudyConfig.parallelism: 'fsdp2' is not one of"),
    (dict(parallelism="fsdp", transports=("qsgd_allgather",)),
     "StudyConfig.transports: 'qsgd_allgather' does not reduce-scatter"),
    (dict(weight_bits=8), "StudyConfig.weight_bits: parameters are gathered only"),
    (dict(parallelism="fsdp", weight_bits=1), "StudyConfig.weight_bits must be None or an int"),
])
def test_bad_study_settings_are_one_line(trace, kwargs, needle):
    with pytest.raises(emulator.ConfigError) as exc:
        emulator.StudyConfig(trace=trace, **kwargs)
    assert needle in str(exc.value)


def test_a_study_refuses_what_its_world_sizes_cannot_form_or_hold(trace):
    base = dict(trace=trace, bits=(32,), transports=("fp32",), topologies=("cluster:dgx_h100x{N}",),
                batch_size=8)
    with pytest.raises(emulator.ConfigError, match="a shard group of 8 GPUs does not divide world_size=12"):
        emulator.run_study(emulator.StudyConfig(world_sizes=(12,), parallelism="hsdp", **base))
    with pytest.raises(emulator.ConfigError, match="more than the H100-SXM's 80 GiB"):
        emulator.run_study(emulator.StudyConfig(world_sizes=(8,), parallelism="fsdp",
                                                **dict(base, batch_size=1024)))


# ---------------------------------------------------------------- choosing a strategy
def test_recommend_strategy_picks_the_fastest_that_fits_within_the_budget(trace, G, model):
    choice = emulator.recommend_strategy(trace, G, compute=model, strategies=("ddp", "fsdp"),
                                         bits=(8, 4))
    assert [(o.strategy, o.transport, o.bits) for o in choice.options] == [
        ("ddp", "fp32", 32), ("ddp", "qsgd_allgather", 8), ("ddp", "qsgd_allgather", 4),
        ("fsdp", "fp32", 32), ("fsdp", "qsgd_scatter_reduce_allgather", 8),
        ("fsdp", "qsgd_scatter_reduce_allgather", 4)]
    assert all(o.fits for o in choice.options)
    assert choice.best.iteration_s == min(o.iteration_s for o in choice.options)
    capped = emulator.recommend_strategy(trace, G, compute=model, strategies=("fsdp",), bits=(8, 4),
                                         budget=emulator.Budget(bits_per_element=6))
    assert [o.bits for o in capped.options] == [32, 4]
    with pytest.raises(emulator.ConfigError, match="strategies: 'fsdp2' is not one of"):
        emulator.recommend_strategy(trace, G, compute=model, strategies=("fsdp2",))
    big = emulator.ComputeModel.for_topology(G, trace, batch_size=1024)
    with pytest.raises(emulator.ConfigError, match="no strategy of .* fits gpt2 at batch 1024"):
        emulator.recommend_strategy(trace, G, compute=big, bits=())

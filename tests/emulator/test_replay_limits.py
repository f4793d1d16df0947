"""replay at its two limits, against the real engine (emulator.simulate on real topologies).

- No communication cost: one GPU (nothing is sent), or links so fast (1e30 bytes/s, 1e-15 s)
  that every collective takes ~1e-14 s: the iteration takes the compute time
  (forward + backward + optimizer seconds).
- Infinitely fast compute (``ComputeModel(compute_scale=0, codec_scale=0)``): every bucket is
  ready at t = 0, so the one communication stream runs the buckets back to back and the
  iteration equals the sum of the buckets' collective seconds, each simulated on its own here.

These limits are those of the textbook model (``algorithm="ring"``): NCCL's model keeps its
protocol latencies on free links (tests/emulator/test_nccl_replay.py checks it).
"""
from __future__ import annotations

import numpy as np
import pytest

import emulator
import qsgd
import topologies
from emulator.compute import ComputeModel

CFG4 = qsgd.QSGDConfig.from_bits(4)  # levels 7, bucket 512, max norm, packed

#: (params, compressed_numel, raw_numel) per DDP bucket: a mixed bucket (the bias goes as fp32,
#: the paper's rule), an all-compressed one and an all-raw one (no QSGD payload at all).
BUCKETS = ((("fc.bias", "fc.weight"), 20_000, 10), (("l1.weight",), 40_000, 0), (("l1.bias",), 0, 100))


def make_trace(batch_size: int = 8) -> qsgd.PayloadTrace:
    """A hand-made 3-bucket, 2-iteration 4-bit packed trace (seconds chosen, payloads exact).

    The last bucket is ready exactly at the end of backward, so any communication of it is
    exposed. Mean compute: forward 2.1 ms + backward 4.1 ms + optimizer 0.1 ms = 6.3 ms.
    """
    iterations = []
    for j, (fwd, bwd) in enumerate(((2.0e-3, 4.0e-3), (2.2e-3, 4.2e-3))):
        ready = (1.0e-3, 3.0e-3, bwd)
        enc = (2e-4, 4e-4, 0.0)
        iterations.append({
            "index": j, "forward_s": fwd, "backward_s": bwd, "optimizer_s": 1e-4,
            "buckets": [{"index": k, "ready_s": ready[k],
                         "payload_bytes": qsgd.payload_nbytes(c, CFG4) if c else 0,
                         "raw_bytes": 4 * r, "encode_s": enc[k], "decode_s": enc[k] / 2}
                        for k, (_, c, r) in enumerate(BUCKETS)]})
    return qsgd.PayloadTrace.from_dict({
        "format": "qsgd-payload-trace", "version": 1, "model": "tiny",
        "parameters": sum(c + r for _, c, r in BUCKETS), "device": "cpu", "device_name": "test CPU",
        "torch_version": "2.13.0", "batch_size": batch_size, "input_shape": [10],
        "config": {"levels": 7, "bucket_size": 512, "norm": "max", "codec": "packed"},
        "min_numel": 1000, "bucket_cap_bytes": 26214400, "first_bucket_bytes": 1048576, "seed": 0,
        "buckets": [{"index": k, "numel": c + r, "params": list(p), "compressed_numel": c, "raw_numel": r}
                    for k, (p, c, r) in enumerate(BUCKETS)],
        "iterations": iterations})


COMPUTE_S = 2.1e-3 + 4.1e-3 + 1e-4
ALL = ("fp32", "fp16", "qsgd_allgather", "qsgd_scatter_reduce_allgather")


def test_trace_helper_means():
    t = make_trace()
    p = emulator.replay(t, topologies.from_spec("switch:2"), world_size=1)
    assert p.compute_s == pytest.approx(COMPUTE_S)


@pytest.mark.parametrize("transport", ALL)
@pytest.mark.parametrize("spec", ["switch:4", "cluster:dgx_a100x2"])
def test_one_gpu_sends_nothing_and_takes_the_compute_time(transport, spec):
    # codec_scale=0: QSGD's encode/decode cost nothing either, so only compute remains.
    p = emulator.replay(make_trace(), topologies.from_spec(spec), transport=transport, world_size=1,
                        compute=ComputeModel(codec_scale=0.0))
    assert p.bytes_per_gpu == 0.0 and p.comm_s == 0.0
    assert p.iteration_s == pytest.approx(COMPUTE_S, rel=1e-12)
    assert p.exposed_comm_s == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("transport", ALL)
def test_free_links_give_the_compute_time(transport):
    free = topologies.switch(4, bandwidth=1e30, latency=1e-15)
    slow = topologies.switch(4, bandwidth=1e8, latency=1e-5)   # 100 MB/s, 10 us
    cm = ComputeModel(codec_scale=0.0)
    p = emulator.replay(make_trace(), free, transport=transport, compute=cm, algorithm="ring")
    assert p.comm_s < 1e-12
    assert p.iteration_s == pytest.approx(COMPUTE_S, abs=1e-12)
    assert p.exposed_comm_s < 1e-12
    # The same iteration on slow links exposes the last bucket's collective (it is ready
    # only when backward ends): the limit above is not vacuous.
    q = emulator.replay(make_trace(), slow, transport=transport, compute=cm, algorithm="ring")
    assert q.exposed_comm_s > 1e-4 and q.iteration_s > COMPUTE_S + 1e-4


def _bucket_collectives(G, transport: str, p: int) -> list[float]:
    """Each bucket's collectives in its wire plan, simulated one by one and summed (the
    emulator's sizes: an allgather's is the gathered total, nccl-tests' convention)."""
    ranks = list(range(p))
    wire = emulator.TRANSPORTS[transport].wire
    out = []
    for _, c, r in BUCKETS:
        layout = qsgd.BucketLayout.of(c, r)
        plan = qsgd.wire_plan(wire, layout, p, CFG4 if emulator.TRANSPORTS[transport].compressed else None)
        t = 0.0
        for coll in plan.collectives:
            op, alg, n = {"allgather": ("allgather", "ring", p * coll.nbytes),
                          "alltoall": ("alltoall", "direct", coll.nbytes),
                          "allreduce": ("allreduce", "ring", coll.nbytes)}[coll.op]
            t += emulator.simulate(G, emulator.build_schedule(op, alg, ranks, n, graph=G)).time_s
        out.append(t)
    return out


@pytest.mark.parametrize("transport", ALL)
@pytest.mark.parametrize("spec, p", [("switch:4", 4), ("cluster:dgx_a100x2", 16)])
def test_infinitely_fast_compute_is_the_sum_of_the_collectives(transport, spec, p):
    G = topologies.from_spec(spec)
    pred = emulator.replay(make_trace(), G, transport=transport, world_size=p,
                           compute=ComputeModel(compute_scale=0.0, codec_scale=0.0),
                           algorithm="ring")
    each = _bucket_collectives(G, transport, p)
    assert all(s > 0 for s in each)
    assert pred.compute_s == 0.0
    assert [b.comm_s for b in pred.buckets] == pytest.approx(each, rel=1e-9)
    assert pred.iteration_s == pytest.approx(sum(each), rel=1e-9)
    assert pred.exposed_comm_s == pytest.approx(pred.iteration_s, rel=1e-12)
    # back to back on the one stream: each bucket's first collective starts when the
    # previous bucket's last one ends
    for a, b in zip(pred.buckets, pred.buckets[1:]):
        assert b.comm_start_s == pytest.approx(a.comm_end_s, rel=1e-12)


@pytest.mark.parametrize("transport", ALL)
def test_bytes_per_gpu_are_the_wire_plans(transport):
    G = topologies.from_spec("switch:4")
    pred = emulator.replay(make_trace(), G, transport=transport)
    wire = emulator.TRANSPORTS[transport].wire
    cfg = CFG4 if emulator.TRANSPORTS[transport].compressed else None
    planned = sum(qsgd.wire_plan(wire, qsgd.BucketLayout.of(c, r), 4, cfg).wire_bytes
                  for _, c, r in BUCKETS)
    assert pred.bytes_per_gpu == pytest.approx(planned, abs=4)


def test_the_hooks_stages_share_the_compute_with_backward():
    # free links: the hook's encodes (0.2 + 0.4 ms, in backward's thread) and the callbacks'
    # decodes (4 payloads of 0.1 and 0.2 ms, each right after its encode) all run during
    # backward on the same compute resource: each decode shares it with backward half and
    # half, so it takes twice its time and backward loses its duration
    free = topologies.switch(4, bandwidth=1e30, latency=1e-15)
    # (the textbook model: NCCL's launch latencies would add microseconds even on free links)
    pred = emulator.replay(make_trace(), free, transport="qsgd_allgather", algorithm="ring")
    assert pred.iteration_s == pytest.approx(COMPUTE_S + 0.6e-3 + 4 * 0.3e-3, rel=1e-9)
    b0, b1, b2 = pred.buckets
    assert b0.end_s - b0.encode_end_s == pytest.approx(2 * 4 * 0.1e-3, rel=1e-6)
    assert b1.ready_s == pytest.approx(2.1e-3 + 3.0e-3 + 0.2e-3 + 0.4e-3, rel=1e-9)
    assert b1.end_s - b1.encode_end_s == pytest.approx(2 * 4 * 0.2e-3, rel=1e-6)
    assert b2.ready_s == pytest.approx(2.1e-3 + 4.1e-3 + 0.6e-3 + 1.2e-3, rel=1e-9)
    # a decode after backward's end delays nothing but the step's end: slow links put bucket
    # 1's payload after backward, its decode then ends the step
    slow = topologies.switch(4, bandwidth=1e6, latency=1e-6)
    q = emulator.replay(make_trace(), slow, transport="qsgd_allgather", algorithm="ring")
    assert q.buckets[1].comm_start_s > 2.1e-3 + 4.1e-3 + 0.6e-3 + 0.4e-3
    assert q.iteration_s == pytest.approx(q.buckets[1].end_s + 1e-4, rel=1e-9)


@pytest.mark.parametrize("G, stretch", [(topologies.from_spec("switch:4"), 2.0),
                                       (topologies.switch(4, bandwidth=1e5, latency=1e-4), 1.0)],
                         ids=["fast", "slow"])
def test_infinitely_fast_compute_with_a_codec_adds_encode_and_decode(G, stretch):
    pred = emulator.replay(make_trace(), G, transport="qsgd_scatter_reduce_allgather",
                           compute=ComputeModel(compute_scale=0.0, codec_scale=1.0),
                           algorithm="ring")
    # per element: bucket 0 (20 000) encodes at 10 ns and decodes at 5 ns, bucket 1 (40 000)
    # the same; each encodes n, the owner decodes p chunks (n) and re-encodes one (n/p), and
    # everyone decodes the p mean chunks (n): 1.25 n * 10 ns + 2 n * 5 ns
    assert pred.encode_decode_s == pytest.approx(2.25 * 60_000 * 1e-8, rel=1e-12)
    assert pred.comm_s > 0
    # the hook issues a bucket's small-tensor allreduce on entry, so it runs under the 0.2 ms
    # encode; the chunk all_to_all waits for both
    b0 = pred.buckets[0]
    small, a2a, mean = b0.collectives
    assert small[0] == "small-tensor allreduce" and small[1] == 0.0
    assert a2a[1] == pytest.approx(max(0.2e-3, small[2]), rel=1e-12)
    # between the two phases the owner's reduce: 20 000 decoded, 5 000 re-encoded; on fast
    # links it and the final decode run beside bucket 1's encode (backward's thread), each
    # at half pace, and push that encode back by their own seconds
    reduce_s, decode_s = 20_000 * 5e-9 + 5_000 * 1e-8, 20_000 * 5e-9
    assert mean[1] - a2a[2] == pytest.approx(stretch * reduce_s, rel=1e-9)
    assert b0.end_s - mean[2] == pytest.approx(stretch * decode_s, rel=1e-9)
    b1 = pred.buckets[1]
    pushed = reduce_s + decode_s if stretch > 1 else 0.0
    assert b1.encode_end_s == pytest.approx(0.2e-3 + 0.4e-3 + pushed, rel=1e-9)


def test_the_step_is_continuous_and_monotone_in_the_link_rate():
    # bucket 0's all_gather ends during bucket 1's encode at some rate of this sweep: its
    # decode then shares the cores with that encode, so a collective a little shorter moves
    # the step by about as much (a decode that stopped backward outright made the step jump
    # by the decode, 0.37 ms, and faster links give a slower step there)
    trace = make_trace()
    steps, comms = [], []
    for rate in np.geomspace(5e6, 40e6, 400):
        G = topologies.switch(4, bandwidth=float(rate), latency=1e-6)
        pred = emulator.replay(trace, G, transport="qsgd_allgather", algorithm="ring")
        steps.append(pred.iteration_s)
        comms.append(pred.comm_s)
    assert np.all(np.diff(steps) <= 1e-15)
    assert np.abs(np.diff(steps)).max() <= 2 * np.abs(np.diff(comms)).max()

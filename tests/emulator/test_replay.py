"""replay: the bucket timeline of the wire plans (exact, with fixed collective times) and errors.

Its limits against the real engine are in test_replay_limits.py.
"""
import pytest

import emulator
import qsgd
import topologies
from emulator.network import Network


def _trace(device="cuda", device_name="NVIDIA A100-SXM4-80GB"):
    it = {"index": 0, "forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.01,
          "buckets": [{"index": 0, "ready_s": 0.05, "payload_bytes": 1052, "raw_bytes": 40,
                       "encode_s": 0.001, "decode_s": 0.002}]}
    return qsgd.PayloadTrace.from_dict({
        "format": "qsgd-payload-trace", "version": 1, "model": "m", "parameters": 2010,
        "device": device, "device_name": device_name, "torch_version": "2.13.0", "batch_size": 2,
        "input_shape": [4], "config": {"levels": 7, "bucket_size": 512, "norm": "max", "codec": "packed"},
        "min_numel": 100, "bucket_cap_bytes": 26214400, "first_bucket_bytes": 1048576, "seed": 0,
        "buckets": [{"index": 0, "numel": 2010, "params": ["w", "b"], "compressed_numel": 2000,
                     "raw_numel": 10}],
        "iterations": [it]})


class FixedNetwork(Network):
    """A network whose every collective takes ``seconds`` (for exact timeline arithmetic)."""

    def __init__(self, G, seconds):
        super().__init__(G, None, "ring")
        self.seconds = seconds

    def collective(self, op, algorithm, nbytes, payload_bytes=None):
        return self.seconds, float(nbytes)

    def op_of(self, algorithm):
        return "allreduce"


G4 = topologies.from_spec("switch:4")


def test_fp32_timeline_exact():
    p = emulator.replay(_trace(), G4, transport="fp32", network=FixedNetwork(G4, 0.5))
    b = p.buckets[0]
    assert b.ready_s == pytest.approx(0.15) and b.start_s == pytest.approx(0.15)
    assert b.end_s == pytest.approx(0.65)
    assert p.iteration_s == pytest.approx(0.65 + 0.01)
    assert p.compute_s == pytest.approx(0.31) and p.exposed_comm_s == pytest.approx(0.35)


def test_qsgd_follows_the_wire_plan_with_codec_stages():
    # _trace(): bucket of 2000 compressed + 10 raw elements, ready 0.05 s into backward
    # (0.15 s into the iteration); encode 1 ms, decode 2 ms per payload; 4 ranks
    p = emulator.replay(_trace(), G4, transport="qsgd_allgather", network=FixedNetwork(G4, 0.5))
    b = p.buckets[0]
    # encode in the hook at once, the raw tensors ride in the payload's one all_gather (0.5 s),
    # then 4 payloads decoded in its callback
    assert b.ready_s == b.start_s == pytest.approx(0.15)
    assert b.encode_end_s == pytest.approx(0.151) and b.comm_start_s == pytest.approx(0.151)
    assert b.comm_end_s == pytest.approx(0.651) and b.comm_s == pytest.approx(0.5)
    assert b.end_s == pytest.approx(0.651 + 4 * 0.002)
    assert [c[0] for c in b.collectives] == ["payload all_gather"]
    assert p.encode_decode_s == pytest.approx(0.001 + 0.008)
    # packed payload sizes are exact (the hand-made trace's 1000 bytes are not)
    assert b.wire_bytes == qsgd.payload_nbytes(2000, qsgd.QSGDConfig.from_bits(4)) + 40
    assert p.iteration_s == pytest.approx(0.659 + 0.01)
    # scatter-reduce-allgather: the raw fp32 allreduce is issued on entry (0.15 s) and holds
    # the stream 0.5 s, the encode (1 ms) runs under it; then the chunk all_to_all, the
    # owner's decode of 4 chunks (4 x 500 elements at 1 us) and re-encode (500 at 0.5 us),
    # the mean chunks' all_gather and the decode of 4 chunks (2000 elements)
    q = emulator.replay(_trace(), G4, transport="qsgd_scatter_reduce_allgather",
                        network=FixedNetwork(G4, 0.5))
    c = q.buckets[0]
    names = [x[0] for x in c.collectives]
    assert names == ["small-tensor allreduce", "chunk all_to_all", "mean chunk all_gather"]
    starts = [x[1] for x in c.collectives]
    assert starts == pytest.approx([0.15, 0.65, 1.15 + 0.002 + 0.00025])
    assert c.encode_end_s == pytest.approx(0.151) and c.comm_s == pytest.approx(1.5)
    assert c.end_s == pytest.approx(1.65225 + 0.002)


def test_hidden_communication_costs_nothing():
    p = emulator.replay(_trace(), G4, transport="fp32", network=FixedNetwork(G4, 0.01))
    assert p.iteration_s == pytest.approx(p.compute_s) and p.exposed_comm_s == pytest.approx(0.0)


def test_bad_inputs_named():
    with pytest.raises(emulator.ConfigError, match="transport"):
        emulator.replay(_trace(), G4, transport="fp8")
    with pytest.raises(emulator.ConfigError, match="world_size"):
        emulator.replay(_trace(), G4, world_size=5)
    with pytest.raises(emulator.ConfigError, match="bits"):
        emulator.replay(_trace(), G4, transport="fp16", bits=8, network=FixedNetwork(G4, 0.1))


def test_a_collective_runs_at_the_loaded_pace_while_the_rank_computes():
    # _trace(): forward 0.1 s, backward 0.2 s (to 0.3 s), the bucket ready at 0.15 s. Its
    # allreduce takes 0.5 s alone and 2.0 s while the rank computes: the 0.15 s of backward
    # left do 0.15 / 2.0 = 7.5 % of it, the other 92.5 % take 0.4625 s after backward: done
    # at 0.7625 s.
    idle, busy = FixedNetwork(G4, 0.5), FixedNetwork(G4, 2.0)
    p = emulator.replay(_trace(), G4, transport="fp32", network=idle, loaded=busy)
    b = p.buckets[0]
    assert b.comm_end_s == pytest.approx(0.3 + 0.925 * 0.5) and b.comm_s == pytest.approx(0.6125)
    # the same network loaded or not: the plain replay
    same = emulator.replay(_trace(), G4, transport="fp32", network=idle, loaded=idle)
    plain = emulator.replay(_trace(), G4, transport="fp32", network=idle)
    assert same.iteration_s == plain.iteration_s and same.buckets == plain.buckets
    # a collective that starts once backward is over never sees the load
    late = emulator.replay(_trace(), G4, transport="fp32", network=FixedNetwork(G4, 0.01),
                           loaded=FixedNetwork(G4, 0.02))
    assert late.buckets[0].comm_s == pytest.approx(0.02)
    # QSGD: the encode (1 ms, in backward's thread) delays the all_gather to 0.151 s and
    # backward's end to 0.301 s; the decodes come after the all_gather, so it sees backward
    # only: 0.15 s of it at the loaded pace
    q = emulator.replay(_trace(), G4, transport="qsgd_allgather", network=idle, loaded=busy)
    assert q.buckets[0].comm_end_s == pytest.approx(0.301 + (1 - 0.15 / 2.0) * 0.5)


def test_backward_goes_at_the_compute_pace_while_a_collective_runs():
    # the bucket's allreduce (0.1 s) runs from 0.15 to 0.25 s; backward, 0.15 s of work left
    # then, does half of 0.1 s of it at pace 0.5 and the other 0.1 s after: ends at 0.35 s
    net = FixedNetwork(G4, 0.1)
    p = emulator.replay(_trace(), G4, transport="fp32", network=net, compute_pace=0.5)
    assert p.iteration_s == pytest.approx(0.35 + 0.01)
    plain = emulator.replay(_trace(), G4, transport="fp32", network=net)
    assert plain.iteration_s == pytest.approx(0.3 + 0.01)
    assert emulator.replay(_trace(), G4, transport="fp32", network=net,
                           compute_pace=1.0).iteration_s == plain.iteration_s
    for bad in (0, 1.5, -1, "0.5", True):
        with pytest.raises(emulator.ConfigError, match="compute_pace"):
            emulator.replay(_trace(), G4, transport="fp32", network=net, compute_pace=bad)

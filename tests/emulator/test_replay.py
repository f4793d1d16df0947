"""replay: the one-stream bucket timeline (exact, with fixed collective times) and errors.

Limits against the real engine (no communication, infinitely fast compute) are in
tests/emulator/test_replay_limits.py.
"""
import pytest

import emulator
import topologies
from emulator.network import Network
from tests.emulator.test_compute import _trace


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


def test_qsgd_adds_codec_and_raw_tensors_in_stream():
    # allgather: the raw fp32 tensors ride in the payload's one all_gather (0.5 s)
    p = emulator.replay(_trace(), G4, transport="qsgd_allgather", network=FixedNetwork(G4, 0.5))
    b = p.buckets[0]
    assert b.encode_end_s - b.start_s == pytest.approx(0.001)
    assert b.comm_end_s - b.encode_end_s == pytest.approx(0.5) and b.comm_s == pytest.approx(0.5)
    assert b.end_s - b.comm_end_s == pytest.approx(0.002)
    assert p.encode_decode_s == pytest.approx(0.003)
    assert b.wire_bytes == 1052 + 40
    # scatter-reduce-allgather: a raw fp32 allreduce (0.5 s) issued before the 1 ms encode
    # runs under it; the payload collective (0.5 s) follows it on the stream
    q = emulator.replay(_trace(), G4, transport="qsgd_scatter_reduce_allgather",
                        network=FixedNetwork(G4, 0.5))
    c = q.buckets[0]
    assert c.comm_end_s - c.start_s == pytest.approx(0.5 + 0.5) and c.comm_s == pytest.approx(1.0)
    assert c.end_s - c.comm_end_s == pytest.approx(0.002)


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

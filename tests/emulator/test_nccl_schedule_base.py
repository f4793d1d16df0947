"""NCCL schedules and their engine times as 1de75a4 built them (before issue 34's speed-ups
of the builders, the schedule's single-transfer rows and the hop tables): every array of the
schedule bit for bit (a digest) and the simulated seconds, on NVLSTree, Tree, Ring and NVLS."""
import hashlib

import numpy as np
import pytest

import emulator
import topologies

#: (spec, bytes, algorithm asked, algorithm NCCL chose, schedule digest, engine seconds)
BASE = [
    ("cluster:dgx_h100x4", 1 << 20, "nccl", "NVLSTree", "50d7ce466d504fa0",
     0.00011013486222222222),
    ("cluster:dgx_h100x4", 1 << 26, "nccl", "NVLSTree", "18e3c0cf2931fcfa",
     0.0004716691244444442),
    ("cluster:dgx_h100x3,fabric=rail", 1 << 22, "nccl", "NVLSTree", "9ce45b142cd2992a",
     0.00013501652444444445),
    ("cluster:dgx_a100x8,fabric=rail", 1 << 20, "nccl_tree", "Tree", "1a0068a0d3488d11",
     0.00021199079999999985),
    ("cluster:pcie_boxx3,fabric=leaf_spine", 1 << 20, "nccl", "Ring", "4183f754ec9246ac",
     0.00047976469079365143),
    ("dgx_h100", 1 << 20, "nccl", "NVLS", "e0e5daf4daac7d3c", 2.9342806666666666e-05),
]


def _digest(s) -> str:
    h = hashlib.sha256()
    for k in ("src", "dst", "size", "compute_s", "dep_ptr", "dep_idx", "tag_code", "route",
              "after"):
        h.update(np.ascontiguousarray(getattr(s, k)).tobytes())
    h.update(repr((s.tags, [tuple(r.via) + (r.flow,) for r in s.routes])).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("spec, nbytes, algo, chosen, digest, seconds", BASE)
def test_schedule_and_time_equal_the_base_commit(spec, nbytes, algo, chosen, digest, seconds):
    G = topologies.from_spec(spec)
    p = len(topologies.gpus(G))
    s = emulator.build_schedule("allreduce", algo, p, nbytes, graph=G)
    assert s.detail["nccl"]["algorithm"] == chosen
    assert _digest(s) == digest
    assert emulator.simulate(G, s).time_s == pytest.approx(seconds, rel=1e-12)


def test_single_transfer_ids_read_alike():
    """Builder.add takes a dependency as an int, a one-element array or a numpy scalar."""
    from emulator.collectives._builder import _single_ids

    assert _single_ids([3, np.asarray([4]), np.int64(5), np.asarray([[6]])]) == (3, 4, 5, 6)
    assert _single_ids([3, np.asarray([4, 5])]) is None
    assert _single_ids([]) == ()

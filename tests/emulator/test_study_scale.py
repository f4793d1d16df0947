"""Studies that reach thousands of GPUs: a topology may stop at a largest size
(``StudyConfig.max_gpus``), each row says how its collectives were timed
(``StudyRow.comm_method``), and rows written before that column read as the engine's."""
from __future__ import annotations

import json

import pytest

import emulator
import qsgd
from emulator import ConfigError, StudyConfig, read_study


@pytest.fixture(scope="module")
def trace():
    return qsgd.measure("mlp", qsgd.QSGDConfig.from_bits(4), device="meta")


def test_a_topology_stops_at_its_largest_size_and_rows_say_the_engine_timed_them(trace):
    cfg = StudyConfig(trace=trace, world_sizes=(2, 4, 8), bits=(32, 4),
                      transports=("fp32", "qsgd_allgather"),
                      topologies=("switch:{n},bw=1Gbit", "ring:{n}"), device="A100",
                      max_gpus={"ring:{n}": 4})
    assert cfg.sizes_of("ring:{n}") == (2, 4) and cfg.sizes_of("switch:{n},bw=1Gbit") == (2, 4, 8)
    assert cfg.to_dict()["max_gpus"] == {"ring:{n}": 4}
    study = emulator.run_study(cfg, time_limit_s=600)
    assert [(r.topology, r.world_size) for r in study.rows if r.transport == "fp32"] == [
        ("switch:{n},bw=1Gbit", 2), ("switch:{n},bw=1Gbit", 4), ("switch:{n},bw=1Gbit", 8),
        ("ring:{n}", 2), ("ring:{n}", 4)]
    # no NCCL collective here, no engine budget reached: every row is the engine's, and the
    # conclusions add nothing about methods
    assert {r.comm_method for r in study.rows} == {"engine"}
    assert not any("Not all by the engine" in c for c in study.conclusions())
    # without limits the config reads as it always did
    assert "max_gpus" not in StudyConfig(trace=trace, world_sizes=(2,)).to_dict()


@pytest.mark.parametrize("limits, needle", [
    ({"fat_tree:k=4": 8}, "must map some of the topologies"),
    ({"switch:{n}": 0}, "is not an int >= 1"),
    ({"switch:{n}": 4}, "none of the world sizes [8, 16] is that small"),
])
def test_bad_limits_are_refused(trace, limits, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        StudyConfig(trace=trace, world_sizes=(8, 16), topologies=("switch:{n}",),
                    max_gpus=limits)


def test_rows_written_before_comm_method_read_as_the_engines(tmp_path, trace):
    study = emulator.run_study(StudyConfig(trace=trace, world_sizes=(2,), bits=(32,),
                                           transports=("fp32",), topologies=("switch:{n}",),
                                           device="A100"))
    path = tmp_path / "study.json"
    study.save_json(path)
    doc = json.loads(path.read_text())
    for r in doc["rows"]:
        del r["comm_method"]
    path.write_text(json.dumps(doc))
    assert [r.comm_method for r in read_study(path).rows] == ["engine"]


def test_the_method_names_the_calibration_and_the_estimate_stops_growing_there():
    """A network whose engine budget sends every NCCL collective to the closed form names
    it, and the study's estimate of a task is capped by that budget."""
    import topologies
    from emulator.estimate import estimate
    from emulator.study import ENGINE_BUDGET_S, _task_bound

    net = emulator.Network(topologies.from_spec("cluster:dgx_h100x16"), engine_budget_s=0.0)
    assert net.method() == "engine"
    net.collective("allreduce", "nccl", 1 << 20)
    net.collective("allreduce", "nccl", 1 << 10)
    assert net.method().startswith("NCCL's closed form calibrated by the engine on 64 GPUs "
                                   "for 2 of 2 collectives (within ")
    net.used.clear()
    net.collective("allreduce", "nccl", 1 << 10)
    assert "for 1 of 1 collectives" in net.method()
    tasks = [(None, "cluster:dgx_a100x{N}", w, ((32, "fp32"), (16, "fp16"))) for w in (8, 8192)]
    grown = estimate(tasks, {0: 1.0}, workers=1).by_task[1]
    capped = estimate(tasks, {0: 1.0}, workers=1, cap=_task_bound).by_task[1]
    assert grown == pytest.approx(1024 ** 2)
    assert capped == pytest.approx(emulator.fastpath.analysis_seconds(8192) + 2 * ENGINE_BUDGET_S)

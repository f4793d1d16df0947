"""The NCCL model against published nccl-tests tables (uncalibrated, sizes >= 1 MiB), a
calibration carried from one table to another of the same system, and the path from a real
NCCL log to a report (``validate import-nccl-tests`` -> ``compare`` -> ``calibrate``).

Sources and hardware of every table are in its header; benchmarks/RESULTS.md ("NCCL model
against published tables") has each table's errors and, where the target is missed, why.
"""
import json
import re
from pathlib import Path

import pytest

import topologies
from emulator.validation import calibrate, compare, import_nccl_tests
from emulator.validation.nccl_tests import infer_topology
from qsgd_emu.cli import main

DATA = Path(__file__).parent / "data" / "nccl_tests"
FIXTURES = Path(__file__).parent / "data" / "validation"
MIB = 1 << 20

#: The issue's target for one table: median |error| and worst |error| (sizes >= 1 MiB).
TARGET = (0.10, 0.25)

#: Per table: (median bound, max bound) the model holds today. TARGET where the model meets
#: it; elsewhere a regression bound a little above today's errors, with the reason the target
#: is missed (benchmarks/RESULTS.md has the numbers).
STATUS = {
    "b200_1node_allgather.log": TARGET,
    # Median met; 8 MiB is 31 % fast (a dip of the measured curve that allgather, the same
    # ring traffic, does not show).
    "b200_1node_reduce_scatter.log": (0.10, 0.35),
    # NVLS from 1 MiB as NCCL picks it; the measured 4-128 MiB times follow NCCL's ring, not
    # NCCL's NVLS cost model (NVLS's small runtime chunks are not in tuning.cc).
    "b200_1node_allreduce.log": (0.16, 0.48),
    # -g 8 (one process drives eight GPUs, NCCL 2.4): 1-4 MiB 22-31 % fast.
    "v100_8gpu_allreduce.log": (0.13, 0.35),
    # Large sizes 11-14 % fast: RoCE at 16 x 200 Gbit/s reaches ~88 % of line rate.
    "h100_oci_2node_allreduce.log": (0.14, 0.17),
    # 2 nodes of B200: mid sizes fast (per-step costs above tuning.cc's); large allgather and
    # reduce_scatter 19 % fast (the report's ib_write_bw: 40-45 of 50 GB/s per HCA).
    "b200_2node_allreduce.log": (0.26, 0.45),
    "b200_2node_allgather.log": (0.36, 0.62),
    "b200_2node_reduce_scatter.log": (0.38, 0.62),
    # Cloud fabrics: EFA / GPUDirect-TCPXO ramp far slower than InfiniBand's, which
    # tuning.cc's network latencies describe (EFA steps take aws-ofi-nccl's 20 + 3 us; p4de
    # runs Simple only); large sizes within 16 %. p4de: 1-16 MiB 28-49 % fast.
    "a100_p4de_2node_allreduce.log": (0.18, 0.57),
    "h100_p5_2node_allreduce.log": (0.35, 0.62),
    "h100_a3mega_2node_allreduce.log": (0.62, 0.87),
}

TABLES = sorted(p.name for p in DATA.glob("*.log"))
MULTI_NODE = {t for t in TABLES if "2node" in t}


def test_every_table_has_a_status():
    assert set(TABLES) == set(STATUS)


def test_tables_cover_generations_node_counts_and_ops():
    gens, ops, nodes = set(), set(), set()
    for name in TABLES:
        text = (DATA / name).read_text()
        assert re.search(r"^# source: \S", text, re.M), name
        assert re.search(r"^# hardware as stated there: \S", text, re.M), name
        t = import_nccl_tests(DATA / name)
        G = topologies.from_spec(t.environment["topology"])
        gens |= {d["sm"] for _, d in G.nodes(data=True) if d.get("kind") == "gpu"}
        ops.add(t.collectives[0].op)
        nodes.add(len({d.get("host") for _, d in G.nodes(data=True) if d.get("kind") == "gpu"}))
        assert sum(c.bytes >= MIB for c in t.collectives) >= 5, name
    assert len(TABLES) >= 8
    assert gens >= {70, 80, 90, 100}
    assert {1, 2} <= nodes
    assert "allreduce" in ops and ops & {"allgather", "reduce_scatter"}


def test_topology_is_inferred_from_devices_and_hosts():
    env = import_nccl_tests(FIXTURES / "all_reduce_perf_2x8_h100.log").environment
    assert (env["topology"], env["topology_from"]) == ("cluster:dgx_h100x2", "devices")
    assert infer_topology({"devices": ["NVIDIA B200"] * 8, "hosts": ["a"]}) == "hgx_b200"
    assert infer_topology({"devices": ["Tesla V100-SXM2-16GB"] * 16, "hosts": ["a", "b"]}) \
        == "cluster:dgx1_v100x2"
    # Unknown, mixed, or not whole machines: no guess.
    assert infer_topology({"devices": ["Radeon"] * 8, "hosts": ["a"]}) is None
    assert infer_topology({"devices": ["NVIDIA A100-SXM4-80GB"] * 6, "hosts": ["a"]}) is None
    assert infer_topology({"devices": ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"] * 4,
                           "hosts": ["a"]}) is None
    # An explicit topology wins over the log's note.
    t = import_nccl_tests(DATA / "h100_p5_2node_allreduce.log", topology="cluster:dgx_h100x2")
    assert (t.environment["topology"], t.environment["topology_from"]) == \
        ("cluster:dgx_h100x2", "argument")


def _check(name):
    r = compare(import_nccl_tests(DATA / name), uncalibrated=True, min_bytes=MIB)
    med, worst = STATUS[name]
    s = r.summary
    assert s["points"] >= 5
    assert s["median_abs_rel_error"] <= med, (name, s)
    assert s["max_abs_rel_error"] <= worst, (name, s)
    assert r.calibration["uncalibrated"] is True
    return r


@pytest.mark.parametrize("name", [t for t in TABLES if t not in MULTI_NODE])
def test_single_node_table_uncalibrated(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MULTI_NODE))
def test_multi_node_table_uncalibrated(name):
    r = _check(name)
    # Whatever misses at mid sizes, the bandwidth regime (>= 1 GiB) is within the target's
    # worst case.
    big = [p for p in r.points if p["bytes"] >= 1 << 30]
    assert big and max(abs(p["rel_error"]) for p in big) <= TARGET[1]


def test_calibration_on_one_table_predicts_another_of_the_system():
    """Fitted on B200 allgather (one node), reduce_scatter of the same box is predicted within
    the target without refitting."""
    src = import_nccl_tests(DATA / "b200_1node_allgather.log")
    G = topologies.from_spec(src.environment["topology"])
    cal = calibrate(src, G, fit_sizes=[1 * MIB, 128 * MIB, 16 << 30])
    assert "nvswitch" in cal.fitted and cal.kept["pcie"] == ("latency", "bandwidth")
    dst = import_nccl_tests(DATA / "b200_1node_reduce_scatter.log")
    before = compare(dst, uncalibrated=True, min_bytes=MIB).summary
    after = compare(dst, calibration=cal, min_bytes=MIB).summary
    assert after["median_abs_rel_error"] <= TARGET[0]
    assert after["median_abs_rel_error"] < before["median_abs_rel_error"]


# -- a real NCCL log to a report on the cluster's real topology (issue 15) ----------------------
@pytest.mark.slow
def test_log_to_report_on_the_real_topology(tmp_path, capsys):
    log = FIXTURES / "all_reduce_perf_2x8_h100.log"
    m, rep = tmp_path / "m.json", tmp_path / "r.json"
    assert main(["validate", "import-nccl-tests", str(log), "--out", str(m)]) == 0
    out = capsys.readouterr().out
    assert "topology cluster:dgx_h100x2 (from 2 host(s) of NVIDIA H100 80GB HBM3)" in out
    # No --topology: compare takes it from the log; it used to need one.
    assert main(["validate", "compare", str(m), "--out", str(rep)]) == 0
    out = capsys.readouterr().out
    assert "topology cluster:dgx_h100x2" in out
    d = json.loads(rep.read_text())
    assert d["topology"] == "cluster:dgx_h100x2"
    # Two fit points, three link classes: fits what two points determine, keeps the rest
    # (it used to refuse: "fit points: 2 given, 6 needed").
    fitted = sum(len(v) for v in d["calibration"]["fitted"].values())
    kept = sum(len(v) for v in d["calibration"]["kept"].values())
    assert 1 <= fitted <= 2 and fitted + kept == 6


@pytest.mark.slow
def test_calibrate_with_more_sizes_says_what_it_fitted(tmp_path, capsys):
    m = tmp_path / "m.json"
    main(["validate", "import-nccl-tests", str(FIXTURES / "all_reduce_perf_2x8_h100.log"),
          "--out", str(m)])
    capsys.readouterr()
    # More sizes than two used to fail with "link class 'nvswitch': the fit points do not
    # determine its bandwidth".
    assert main(["validate", "calibrate", str(m), "--topology", "cluster:dgx_h100x2",
                 "--fit-sizes", "8,2MiB,32MiB,128MiB"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("link class")]
    assert {ln.split()[2] for ln in lines} == {"ib", "nvswitch", "pcie"}
    assert all("fitted:" in ln and "kept from the topology:" in ln for ln in lines)
    assert any("fitted: nothing" not in ln for ln in lines)


def test_compare_uncalibrated_cli_on_a_published_table(tmp_path, capsys):
    m, rep = tmp_path / "m.json", tmp_path / "r.json"
    main(["validate", "import-nccl-tests", str(DATA / "b200_1node_allgather.log"), "--out", str(m)])
    capsys.readouterr()
    assert main(["validate", "compare", str(m), "--uncalibrated", "--min-bytes", "1MiB",
                 "--out", str(rep)]) == 0
    d = json.loads(rep.read_text())
    assert d["calibration"]["uncalibrated"] is True
    assert all(p["held_out"] for p in d["points"])
    assert d["summary"]["median_abs_rel_error"] <= TARGET[0]


def test_uncalibrated_and_a_calibration_exclude_each_other(tmp_path, capsys):
    m, cal = tmp_path / "m.json", tmp_path / "c.json"
    main(["validate", "import-nccl-tests", str(DATA / "b200_1node_allgather.log"), "--out", str(m)])
    cal.write_text(json.dumps({"links": {"nvswitch": {"alpha_s": 1e-6, "bandwidth": 1e11}}}))
    capsys.readouterr()
    rc = main(["validate", "compare", str(m), "--uncalibrated", "--calibration", str(cal)])
    err = capsys.readouterr().err
    assert rc != 0 and "uncalibrated" in err and len(err.strip().splitlines()) == 1

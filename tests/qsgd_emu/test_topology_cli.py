import json

import pytest

from qsgd_emu.cli import main


def test_topology_table(capsys):
    assert main(["topology", "fat_tree:k=4,bw=100Gbit"]) == 0
    out = capsys.readouterr().out
    assert "GPUs                 16" in out
    assert "bisection bandwidth  100.00 GB/s" in out                     # 8 x 12.5 GB/s
    assert "diameter             6 hops" in out


def test_topology_json_route_and_save(capsys, tmp_path):
    path = tmp_path / "t.graphml"
    assert main(["topology", "dgx1_v100", "--json", "--route", "0", "gpu5",
                 "--save", str(path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["gpus"] == 8 and s["links_by_class"]["nvlink"] == 16
    assert s["route"]["path"] in (["gpu0", "gpu1", "gpu5"], ["gpu0", "gpu4", "gpu5"])
    assert s["route"]["equal_cost_paths"] == 2
    assert s["route"]["latency_s"] == pytest.approx(1.2e-6)
    assert path.exists()
    assert main(["topology", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["links"] == 33


@pytest.mark.parametrize("argv, words", [
    (["topology", "rign:8"], "family 'rign' is not known"),
    (["topology", "ring:8", "--route", "0", "99"], "rank 99 is out of range"),
    (["topology", "ring:8", "--route", "0", "nope"], "'nope' is neither a node id nor a rank"),
])
def test_topology_errors_exit_2_with_one_line(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_bench_prints_a_table_with_ratios(capsys):
    import argparse
    from qsgd_emu.bench import topologies as bench
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args(["--max-gpus", "1024", "--baseline-pairs", "4"])) == 0
    out = capsys.readouterr().out
    assert "fat_tree:k=16" in out and "speedup" in out and "fat_tree:k=32" not in out
    rows = [bench.bench_case("fat_tree:k=4", 2)]
    assert rows[0]["gpus"] == 16 and rows[0]["speedup"] > 0
    with pytest.raises(ValueError, match="--max-gpus=0"):
        bench.run(p.parse_args(["--max-gpus", "0"]))

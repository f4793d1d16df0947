"""``qsgd-emu bench emulator --nccl``: NCCL's model with channels next to the textbook ring.

No timing assertions: speed is what the benchmark measures, not a unit test.
"""
import json

from qsgd_emu.cli import main

# The congested cases and the start-up timing have their own tests (test_bench_emulator.py).
QUICK = ["--congested", "none", "--no-startup"]


def test_nccl_rows_simulate_channels_and_match_the_closed_form(capsys):
    assert main(["bench", "emulator", "--sizes", "32", "--bytes", "1MB", "--nccl", "16",
                 "--json", *QUICK]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["rows"]) == 1 and d["rows"][0]["gpus"] == 32
    (r,) = d["nccl"]
    # NCCL's channels for the size (two per NIC for the communicator, fewer for a small
    # message), as the model's plan says
    import emulator
    import topologies
    G = topologies.from_spec("cluster:dgx_a100x2")
    assert r["gpus"] == 16 and r["channels"] == emulator.nccl_plan(G, "allreduce", 10**6).channels
    assert 8 <= r["channels"] <= 16
    # Channels share NVSwitch links: the event loop ran.
    assert r["events"] > 0
    assert abs(r["closed_form_s"] / r["time_s"] - 1) < 0.15


def test_nccl_table_and_bad_counts(capsys):
    assert main(["bench", "emulator", "--sizes", "32", "--bytes", "1MB", "--nccl", "16", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "as NCCL runs it on cluster:dgx_a100xN" in out and "   16 " in out
    assert main(["bench", "emulator", "--sizes", "32", "--nccl", "12", *QUICK]) == 2
    err = capsys.readouterr().err
    assert "--nccl" in err and err.count("\n") == 1

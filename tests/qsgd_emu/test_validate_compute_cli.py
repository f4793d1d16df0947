"""``qsgd-emu validate compute``: predicted against published single-GPU throughput."""
import json
from pathlib import Path

from emulator.validation.compute import DEFAULT_PATH, load_cases
from qsgd_emu.cli import main

IDS = ("lambda-v100-sxm2-16gb-resnet50-fp32-b128", "lambda-a10-resnet50-amp-fp16-b448")


def test_the_command_prints_each_case_and_the_summary(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["validate", "compute", "--ids", ",".join(IDS), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    rows = [ln for ln in cap.out.splitlines() if ln.startswith(IDS)]
    assert len(rows) == 2
    doc = json.loads(out.read_text())
    published = {c.id: c.samples_per_s for c in load_cases() if c.id in IDS}
    for r in doc["rows"]:
        assert r["published"] == published[r["id"]]
        assert r["error"] == r["predicted"] / r["published"] - 1
        line = next(ln for ln in rows if ln.startswith(r["id"]))
        assert f"{r['predicted']:.1f}" in line and f"{r['error']:+.1%}" in line
    assert "2 cases (samples/s): median |error|" in cap.out
    # progress on stderr, a line per case (not a terminal: no redraws)
    assert cap.err.splitlines()[-1].startswith("validate compute 2/2 cases") and "\r" not in cap.err


def test_an_unknown_case_is_one_line_naming_it(capsys):
    assert main(["validate", "compute", "--ids", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "['nope']" in err[0]


def test_every_case_names_a_zoo_model_a_gpu_and_a_precision_that_fit():
    # the README's tour runs two cases; each case's model builds (meta) and its GPU has units
    # for its precision, so `validate compute` with no ids reaches every row
    import torch

    import qsgd
    from emulator.compute import device, precision

    cases = load_cases()
    assert len(cases) >= 30 and len({c.id for c in cases}) == len(cases)
    for c in cases:
        with torch.device("meta"):
            model = qsgd.build_model(c.model, **c.args)
        assert sum(p.numel() for p in model.parameters()) > 1e6, c.id
        precision(c.precision).check(device(c.device))


def test_a_case_naming_an_optimizer_the_recorder_lacks_is_one_line(tmp_path, capsys):
    doc = json.loads((Path(__file__).resolve().parents[2] / DEFAULT_PATH).read_text())
    doc["cases"][2]["zoo"]["optimizer"] = "lamb"
    bad = tmp_path / "cases.json"
    bad.write_text(json.dumps(doc))
    assert main(["validate", "compute", "--cases", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cases[2].zoo.optimizer must be one of ['adamw', 'bertadam', 'sgd'], " \
                              "got 'lamb'" in err[0]

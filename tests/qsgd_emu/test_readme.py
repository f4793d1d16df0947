"""The README's command tour runs as written (at small sizes), and every path the docs name exists.

Commands are read from the README's code blocks, so a flag renamed in the code and not in the
README fails here. Each runs with its own arguments, then a few appended overrides that only
shrink the work (a small model, fewer GPUs, fewer repetitions): argparse takes the last value.
"""
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testbench import free_port
from tests.qsgd_emu.cli_run import run_cli

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: appended to a command (matched by its first words) to keep it small
SMALL = {
    "measure": ["--model", "mlp", "--iterations", "1", "--batch-size", "2", "--device", "cpu"],
    "study": ["--world-sizes", "8,16"],
    "recommend": ["--world-sizes", "8", "--transports", "qsgd_allgather", "--bits", "2,4,8"],
    "train": ["--epochs", "1", "--spawn", "2"],
    "simulate --topology ring:8 --min-bytes": ["--max-bytes", "1M"],
    "bench qsgd": ["--numel", "65536", "--repeats", "1"],
    "bench emulator": ["--sizes", "64", "--naive-max", "64", "--congested", "none", "--no-startup"],
    "bench topologies": ["--max-gpus", "64", "--baseline-pairs", "2"],
    # the whole table (44 s) is what benchmarks/RESULTS.md quotes; two cases run the command here,
    # and test_validate_compute_cli checks that each case's model and precision are buildable
    "validate compute": ["--ids", "lambda-v100-sxm2-16gb-resnet50-fp32-b128,"
                                  "lambda-v100-sxm2-16gb-bert-large-squad-fp16-b16"],
}


def readme_commands() -> list[list[str]]:
    """The ``qsgd-emu`` lines of the README's code blocks, continuations joined, comments and
    ``[optional | alternative]`` parts dropped, ``a | b | c`` alternatives expanded."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        block = re.sub(r"\\\n\s*", " ", block)
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line.startswith("qsgd-emu "):
                continue
            line = re.sub(r"\s*\[[^]]*\]", "", line)
            words = shlex.split(line)[1:]
            if "|" in words:
                head = words[:words.index("|") - 1]
                alts = [w for w in words[len(head):] if w != "|"]
                out += [head + [a] for a in alts]
            else:
                out.append(words)
    return out


def _small(words):
    key = " ".join(words)
    extra = [v for k, v in SMALL.items() if key.startswith(k)]
    return words + (max(extra, key=len) if extra else [])


def test_the_tour_is_found():
    cmds = readme_commands()
    firsts = [c[0] for c in cmds]
    for name in ("measure", "topology", "simulate", "study", "train", "dashboard", "validate", "bench"):
        assert name in firsts
    assert ["bench", "emulator"] in cmds


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_readme_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for rel in ("tests",):   # the README names test data by its path in the repository
        os.symlink(ROOT / rel, tmp_path / rel)
    for words in readme_commands():
        if words[0] == "dashboard":
            _serve_dashboard(words)
            continue
        code, out, err = run_cli(_small(words))
        assert code == 0, f"qsgd-emu {' '.join(words)}: exit {code}\n{err[-2000:]}"


def _serve_dashboard(words):
    port = str(free_port())
    exe = Path(sys.executable).with_name("qsgd-emu")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "qsgd_emu"]
    proc = subprocess.Popen(cmd + words + ["--port", port], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    assert r.status == 200
                    return
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the dashboard did not answer in 60 s"
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _named_paths(text: str):
    """Repository paths the text names: markdown link targets and `backticked/paths.ext`."""
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if not re.match(r"[a-z]+://", target):
            yield target
    for token in re.findall(r"`([A-Za-z0-9_./-]+\.(?:md|py|sh|json|log|txt|yaml|toml))`", text):
        if "/" in token and not token.startswith(("out/", "~")):
            yield token


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_the_docs_name_exists(doc):
    missing = [p for p in _named_paths(doc.read_text())
               if not (doc.parent / p).exists() and not (ROOT / p).exists()]
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"

"""The what-if page's default study (DGX A100 machines, ResNet-50 measured on this CPU, 8 to
128 GPUs, every width and QSGD transport) runs to its figures in a real headless Chromium.

Its wall time is a benchmark figure (benchmarks/RESULTS.md, the engine section), not asserted
here; the timeout only bounds a hang.
"""
from __future__ import annotations

import pytest

from tests.dashboards.test_browser import figure, wait_figure

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_default_whatif_draws_its_figures(server, page):
    page.goto(f"{server.url}/whatif")
    page.wait_for_selector("#whatif-run")
    assert page.input_value("#whatif-sizes") == "8,16,32,64,128"
    page.click("#whatif-run")
    fig = wait_figure(page, "whatif-scaling",
                      lambda f: len(f["names"]) >= 3 and f["xs"][0] == [8, 16, 32, 64, 128], 600)
    assert any(n.startswith("fp32") for n in fig["names"])
    assert any("scatter" in n or "allgather" in n for n in fig["names"] if "bit" in n)
    # every row drawn: one point per world size on every line, all throughputs positive
    assert all(len(ys) == 5 and min(ys) > 0 for ys in fig["ys"])
    names = figure(page, "whatif-breakdown")["names"]
    assert names[:2] == ["compute", "exposed communication"]
    assert names[2].startswith("encode/decode")
    assert "collective" in figure(page, "whatif-gantt")["names"]

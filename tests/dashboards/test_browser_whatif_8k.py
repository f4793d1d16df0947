"""The What-if's ladder to 8,192 GPUs in a real headless Chromium: picking it fills the sizes,
the study runs (a small model, fp32 and one QSGD width) to its figures, and the page says how the
8,192-GPU point was computed (NCCL's closed form calibrated on a smaller cluster)."""
from __future__ import annotations

import pytest

from dashboards.pages import whatif
from tests.dashboards.test_browser import assert_readable, wait_figure

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_ladder_to_8192_gpus_runs_and_names_the_method(server, page):
    page.goto(f"{server.url}/whatif?model=mlp&bits=32,4&transports=qsgd_allgather")
    page.wait_for_selector("#whatif-run")
    label, sizes = whatif.LADDERS[1]
    assert sizes == "8,64,8192"
    page.click("#whatif-ladder")
    page.get_by_text(label, exact=True).click()
    page.wait_for_function("(v) => document.querySelector('#whatif-sizes').value === v",
                           arg=sizes)
    page.click("#whatif-run")
    fig = wait_figure(page, "whatif-scaling", lambda f: f["xs"][0] == [8, 64, 8192], 300)
    assert all(len(ys) == 3 and min(ys) > 0 for ys in fig["ys"])
    page.wait_for_function(
        "() => document.getElementById('whatif-conclusions').innerText.includes('8192 GPUs')")
    said = page.inner_text("#whatif-conclusions").splitlines()
    big = [s for s in said if s.startswith("cluster:dgx_a100x1024, 8192 GPUs")]
    assert len(big) == 1 and "Not all by the engine" in big[0], said
    assert "NCCL's closed form calibrated by the engine on" in big[0]
    small = [s for s in said if s.startswith("cluster:dgx_a100x1, 8 GPUs")]
    assert len(small) == 1 and "Not all by the engine" not in small[0]
    # the GPU axis reads 8, 64, 8192 (no minor ticks of a log scale)
    figs = {f["title"]["text"][:20]: f for f in assert_readable(page)}
    ticks = [t["text"] for t in figs["throughput against G"]["axes"]["x"]["ticks"]]
    assert ticks == ["8", "64", "8192"], ticks

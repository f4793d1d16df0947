"""The Recommend page in a real headless Chromium against a real ``qsgd-emu dashboard`` server:
the background job measures an MLP here, searches, and the page draws the Pareto front, the
per-layer bits and the configuration to copy; bad input is a message naming the field."""
from __future__ import annotations

import pytest

from tests.dashboards.test_browser import error_text, type_into, wait_figure

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUERY = "model=mlp&spec=switch:{n},bw=1Gbit&size=4&device=measured&budget=variance_as_bits&value=4"


def test_recommend_draws_front_bits_and_config(server, page):
    page.goto(f"{server.url}/recommend?{QUERY}")
    page.wait_for_selector("#recommend-run")
    page.click("#recommend-run")
    front = wait_figure(page, "recommend-front", lambda f: "Pareto front" in f["names"], 180)
    assert front["names"] == ["Pareto front", "uniform widths", "recommended"]
    assert front["xaxis"] == "gradient variance increase (relative)"
    assert all(y > 0 for y in front["ys"][0]) and len(front["ys"][2]) == 1
    bits = wait_figure(page, "recommend-bits", lambda f: len(f["xs"][0]) >= 1, 30)
    assert all(2 <= b <= 8 for b in bits["ys"][0])
    assert all(name.startswith("layers.") for name in bits["xs"][0])
    text = page.inner_text("#recommend-config")
    assert "qsgd.QSGDState(" in text and "bit_policy=" in text
    assert "done:" in page.inner_text("#recommend-progress-text")
    assert page.js_errors == []


def test_recommend_bad_budget_names_the_field(server, page):
    page.goto(f"{server.url}/recommend?{QUERY}")
    page.wait_for_selector("#recommend-run")
    type_into(page, "#recommend-value", "lots")
    page.click("#recommend-run")
    assert "recommend-value: expected a number, got 'lots'" in error_text(page, "recommend-error")
    page.click("#recommend-budget")
    page.click("text=max variance increase")
    type_into(page, "#recommend-value", "-1")
    page.click("#recommend-run")
    page.wait_for_function(
        "() => document.getElementById('recommend-error').innerText.includes('budget variance must be')",
        timeout=180_000)
    assert server.alive()


#: an MLP on four H100s; a bits-per-element budget, so a strategy needs only the layout and
#: operators recorded on the meta device
STRATEGY_QUERY = "model=mlp&spec=switch:{n},bw=1Gbit&size=4&device=H100-SXM" \
                 "&budget=bits_per_element&value=4"


def test_recommend_picks_a_strategy_at_the_batch_and_precision_set(server, page):
    page.goto(f"{server.url}/recommend?{STRATEGY_QUERY}")
    page.wait_for_selector("#recommend-run")
    type_into(page, "#recommend-batch", "32")
    page.click("#recommend-precision")
    page.get_by_role("option", name="amp-fp16", exact=True).click()
    page.click("#recommend-attention")
    page.get_by_role("option", name="triton", exact=True).click()
    # ddp (widths per layer) is picked; add two sharded strategies beside it
    page.click("#recommend-parallelism")
    page.get_by_role("option", name="fsdp", exact=True).click()
    page.get_by_role("option", name="zero2", exact=True).click()
    page.keyboard.press("Escape")
    # the fields are shared by URL, as the What-if page's
    page.wait_for_function("() => location.search.includes('parallelism=ddp%2Cfsdp%2Czero2')")
    assert "batch=32" in page.url and "precision=amp-fp16" in page.url
    assert "attention=triton" in page.url
    page.click("#recommend-run")
    page.wait_for_selector("#recommend-strategy-table tbody tr", timeout=120_000)
    rows = page.eval_on_selector_all(
        "#recommend-strategy-table tbody tr",
        "rows => rows.map(r => ({cells: Array.from(r.cells).map(c => c.innerText.trim()), "
        "picked: r.classList.contains('picked')}))")
    head = page.eval_on_selector_all("#recommend-strategy-table thead th",
                                     "ths => ths.map(t => t.innerText.trim())")
    assert head[:6] == ["strategy", "transport", "bits", "iteration ms", "memory per GPU GB", "fits"]
    assert {r["cells"][0] for r in rows} == {"ddp", "fsdp", "zero2"}
    # dense and 4-bit options only (the budget: 4 bits per element)
    assert {r["cells"][2] for r in rows} == {"32", "4"}
    (picked,) = [r for r in rows if r["picked"]]
    fastest = min(float(r["cells"][3]) for r in rows if r["cells"][5] == "yes")
    assert float(picked["cells"][3]) == fastest
    assert page.inner_text("#recommend-strategy-pick").startswith(f"picked: {picked['cells'][0]} with ")
    text = page.inner_text("#recommend-config")
    assert text.startswith(f"# {picked['cells'][0]} with ")
    assert "# assumed: H100-SXM amp-fp16 at batch 32 per GPU" in text
    # the kernel reached the job, which says the MLP has no fused attention for it to time
    assert "attention kernel 'triton' not applied: the trace has no fused attention" in text
    front = wait_figure(page, "recommend-front", lambda f: f["names"] == [], 30)
    assert front is not None
    assert "strategy recommendation: see the table" in page.inner_text("#recommend-front")
    assert page.js_errors == []

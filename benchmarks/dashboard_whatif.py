"""The dashboard's default what-if, timed: ``dashboards.jobs.whatif_job`` with the page's defaults.

DGX A100 machines, ResNet-50 recorded on the meta device (layout and operators), widths 32/16/8/4/2, both QSGD transports,
8 to 128 GPUs, one process. Runs twice in one process: the first records ResNet-50 into the
cache directory, the second finds its trace there. Issues 11 and 32's target: <= 30 s.

``--browser`` times what a person waits for instead: a real ``qsgd-emu dashboard`` server
and Debian's chromium (Playwright, from the test extra), the What-if page opened with its
defaults, Run clicked, until all five figures are drawn; twice, on a fresh cache directory
(measuring included) and again (the trace cached). The background callback's own process,
the page's polling and the drawing are in it.

    .venv/bin/python benchmarks/dashboard_whatif.py [--browser] [CACHE_DIR]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import emulator  # noqa: E402
from dashboards import jobs  # noqa: E402
from dashboards.pages import whatif  # noqa: E402

#: The page's figures (before the headline figure there were four).
FIGURES = ("whatif-headline", "whatif-scaling", "whatif-speedup", "whatif-breakdown",
           "whatif-gantt")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run"]


def in_process(cache: str) -> None:
    d = whatif.DEFAULTS
    params = whatif.params_from_form(
        topology=d["topology"], spec="", topology_upload=None, topology_filename=None,
        model=d["model"], trace_upload=None, trace_filename=None, bits=d["bits"],
        bucket=d["bucket"], transports=[t for t, v in emulator.TRANSPORTS.items() if v.compressed],
        sizes=d["sizes"], device=d["device"])
    params["cache_dir"] = cache
    for label in ("measuring the model", "trace cached"):
        t0 = time.perf_counter()
        out = jobs.whatif_job(params)
        print(f"{label:<20} {time.perf_counter() - t0:6.1f} s  {len(out['rows'])} rows")


def in_browser(cache: str, timeout_s: float = 600.0) -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if not chromium:
        print("--browser needs Debian's chromium and Playwright (make test installs both)")
        return 2
    from testbench import free_port

    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "qsgd-emu")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "qsgd_emu"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    server = subprocess.Popen(
        cmd + ["dashboard", "--port", str(port), "--store", os.path.join(cache, "runs.sqlite"),
               "--cache-dir", cache], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/whatif"
    # every figure of the page drawn with data (the placeholders have none)
    drawn = ("(least) => { const els = document.querySelectorAll('#whatif-page .js-plotly-plot');"
             " return els.length >= least && Array.from(els).every(el => el.data && "
             "el.data.length > 0); }")
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                time.sleep(0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
            for label in ("measuring the model", "trace cached"):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url)
                page.wait_for_selector("#whatif-run")
                t0 = time.perf_counter()
                page.click("#whatif-run")
                page.wait_for_function(drawn, arg=len(FIGURES), timeout=timeout_s * 1000,
                                       polling=100)
                print(f"{label:<20} {time.perf_counter() - t0:6.1f} s  click to every figure drawn")
                page.close()
            browser.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    browser = "--browser" in argv
    rest = [a for a in argv if a != "--browser"]
    cache = rest[0] if rest else tempfile.mkdtemp(prefix="whatif-")
    if browser:
        return in_browser(cache)
    in_process(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())

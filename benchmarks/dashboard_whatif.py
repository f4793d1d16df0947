"""The dashboard's default what-if, timed: ``dashboards.jobs.whatif_job`` with the page's defaults.

DGX A100 machines, ResNet-50 measured on this CPU, widths 32/16/8/4/2, both QSGD transports,
8 to 128 GPUs, one process. Runs twice in one process: the first measures ResNet-50 into the
cache directory, the second finds its trace there. Issue 11's target: <= 30 s.

    .venv/bin/python benchmarks/dashboard_whatif.py [CACHE_DIR]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import emulator  # noqa: E402
from dashboards import jobs  # noqa: E402
from dashboards.pages import whatif  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cache = argv[0] if argv else tempfile.mkdtemp(prefix="whatif-")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

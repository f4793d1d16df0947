"""Run ``qsgd-emu`` in-process for tests: exit code, stdout and stderr."""
from __future__ import annotations

import contextlib
import io

from qsgd_emu import cli


def run_cli(argv) -> tuple[int, str, str]:
    """``qsgd-emu ARGV`` in this process; argparse's own exits become the exit code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()

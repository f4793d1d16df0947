"""A figure as a PNG, drawn by Debian's chromium headless when this machine has it.

The report writes its headline figure as ``headline.png`` (the README shows it). plotly's own
image export needs kaleido, which is no dependency of the project; a browser that draws the
figure's HTML and screenshots it gives the same picture that ``report.html`` shows, from the
same plotly.js. The tests already use Debian's ``chromium`` (CI installs it); a machine
without it gets no PNG and a reason, never an error: the HTML report is the result.

>>> from emulator import figimage
>>> figimage.browser() in (None, figimage.browser())
True
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["browser", "write_png"]

#: Flags of a headless, offline, throw-away chromium (as the browser tests run it).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=10000")


def browser() -> str | None:
    """The path of Debian's chromium, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def write_png(fig, path: str | os.PathLike, *, width: int = 1000, height: int = 460,
              timeout_s: float = 60.0) -> str:
    """Draw ``fig`` (a plotly Figure) ``width`` x ``height`` CSS pixels into the PNG ``path``.

    Returns
    -------
    str
        ``""`` when the PNG was written, else why not (no chromium; it failed; it timed out).

    Examples
    --------
    >>> import os, tempfile
    >>> from emulator import figimage, figures
    >>> path = os.path.join(tempfile.mkdtemp(), "f.png")
    >>> why = figimage.write_png(figures.message_figure("hello"), path, width=300, height=200)
    >>> png = why == "" and open(path, "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
    >>> png or why.startswith("no chromium")
    True
    """
    import plotly.io as pio

    exe = browser()
    if exe is None:
        return "no chromium on this machine (apt-get install -y chromium)"
    path = os.path.abspath(os.fspath(path))
    with tempfile.TemporaryDirectory(prefix="qsgd-emu-png-") as tmp:
        page = os.path.join(tmp, "figure.html")
        div = pio.to_html(fig, include_plotlyjs=True, full_html=False, default_width=width,
                          default_height=height, config={"staticPlot": True})
        with open(page, "w", encoding="utf-8") as f:
            f.write("<!DOCTYPE html><html><head><meta charset='utf-8'><style>body{margin:0;"
                    "background:#fff}</style></head><body>" + div + "</body></html>")
        tmp_png = os.path.join(tmp, "figure.png")
        cmd = [exe, *FLAGS, f"--user-data-dir={os.path.join(tmp, 'profile')}",
               f"--window-size={width},{height}", f"--screenshot={tmp_png}", "file://" + page]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"chromium took more than {timeout_s:.0f} s"
        if not os.path.exists(tmp_png):
            tail = (run.stderr or "").strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            return f"chromium wrote no PNG ({tail[0][:200]})"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.move(tmp_png, path)
    return ""

"""Output paths checked when the command line is read, before any measuring or simulating.

``type=output_file`` / ``type=output_dir`` on an argparse option create the missing parent
folders and prove the place writable with a throw-away file, so that a long run never fails at
its very end on a path it could have refused at once. Errors name the path as the user gave it.
"""
from __future__ import annotations

import argparse
import os
import tempfile

__all__ = ["output_file", "output_dir"]


def _writable_folder(folder: str, given: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".qsgd-emu-probe-"):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise argparse.ArgumentTypeError(f"{given!r}: cannot write in {folder!r} ({why})") from None


def output_file(text: str) -> str:
    """A file the command will write: its folder exists (created) and is writable."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    _writable_folder(os.path.dirname(os.path.abspath(text)), text)
    return text


def output_dir(text: str) -> str:
    """A folder the command will write files in: created when missing, and writable."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    _writable_folder(os.path.abspath(text), text)
    return text

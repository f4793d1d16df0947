"""Output paths checked when the command line is read, before any measuring or simulating.

``type=output_file`` / ``type=output_dir`` on an argparse option prove that the path can be
written: the nearest folder that exists on the way to it takes a throw-away file, and nothing
in the way is a file where a folder must be (or a folder where the file goes). The folders
themselves are made when the result is written, so a command refused for another option leaves
nothing behind. Errors name the path as the user gave it.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

__all__ = ["output_file", "output_dir", "write_json"]


def _check_folder(folder: str, given: str) -> None:
    """``folder`` exists and takes files, or the nearest folder above it does."""
    existing = folder
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{given!r}: {existing!r} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".qsgd-emu-probe-"):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise argparse.ArgumentTypeError(f"{given!r}: cannot write in {existing!r} ({why})") from None


def output_file(text: str) -> str:
    """A file the command will write: not a folder, and its folder can be made and written."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    _check_folder(os.path.dirname(os.path.abspath(text)), text)
    return text


def output_dir(text: str) -> str:
    """A folder the command will write files in: not a file, and it can be made and written."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    _check_folder(os.path.abspath(text), text)
    return text


def write_json(path: str, doc) -> None:
    """Write ``doc`` as indented JSON to ``path`` (checked by :func:`output_file`), making its
    folders first: the one way the commands write their ``--out`` documents."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")

"""Exceptions of :mod:`dashboards`. Every message names the bad field and its value."""
from __future__ import annotations


class DashboardError(ValueError):
    """An input of the dashboard (a form field, an upload, a URL parameter) is not valid.

    Callbacks turn it into a message on the page; the server stays up.
    """


class UnavailableError(RuntimeError):
    """A part of the project a page needs (an emulator or qsgd name) is not installed or broken.

    The page shows the message and the rest of the dashboard keeps working.
    """

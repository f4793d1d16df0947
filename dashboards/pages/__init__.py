"""One module per page; :data:`PAGES` orders the navigation bar (the first is the home page).

Each page module defines ``NAME`` (the prefix of its component ids), ``PATH``, ``TITLE``,
``layout(query, ctx)`` (the page for a URL query, as a dict of strings) and
``register(app, ctx)`` (its callbacks). Callback bodies call plain module functions, which
the tests call directly.
"""
from __future__ import annotations

from dashboards.pages import live, recommend, topology, validation, whatif

PAGES = (whatif, topology, live, validation, recommend)

__all__ = ["PAGES"]

"""The Plotly Dash dashboard: what-if studies, topology views, live runs and validation.

``create_app`` is loaded on first use, so ``import dashboards`` does not import Dash.
"""
from __future__ import annotations

import importlib

_EXPORTS: dict[str, str] = {
    "create_app": "dashboards.app",
    "DashboardError": "dashboards.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'dashboards' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__

"""The Plotly Dash dashboard: what-if studies, topology views, live runs and validation.

``create_app(store_path)`` returns the Dash app; ``qsgd-emu dashboard`` serves it. Nothing is
computed at import time: pages run the emulator in background callbacks.
"""
from .app import create_app
from .errors import DashboardError

__all__ = ["create_app", "DashboardError"]

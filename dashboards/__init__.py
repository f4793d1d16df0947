"""The Plotly Dash dashboard: what-if studies, topology views, live runs and validation."""
__all__: list[str] = []

"""A SimPy flow-level network emulator that replays QSGD payloads through collective algorithms."""
__all__: list[str] = []

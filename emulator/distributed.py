"""Run study tasks on a Dask cluster (``qsgd-emu study --cluster tcp://host:8786``).

Dask (``distributed``) rather than Ray: it is pure Python, installs from PyPI without a
daemon or a native object store, a :class:`distributed.LocalCluster` starts in seconds (so CI
tests against a real cluster), and a user's existing scheduler is reached by its address
alone. Tasks are independent (one per topology and world size) and small to ship: the
config (with the trace) and a spec string; each returns its rows.
"""
from __future__ import annotations

from typing import Callable, Sequence

from emulator.errors import ConfigError


def map_on_cluster(fn: Callable, tasks: Sequence, address: str, *,
                   on_done: Callable[[int, object], None] | None = None,
                   timeout_s: float = 30.0) -> list:
    """``[fn(t) for t in tasks]`` computed on the Dask scheduler at ``address``, in task order.

    Parameters
    ----------
    fn : callable
        An importable module-level function (workers unpickle it by name).
    address : str
        Scheduler address, e.g. ``"tcp://127.0.0.1:8786"``.
    on_done : callable, optional
        ``on_done(index, result)`` once per finished task, as it finishes (progress).
    timeout_s : float
        Seconds to wait for the scheduler to answer.
    """
    if not isinstance(address, str) or not address:
        raise ConfigError(f"cluster must be a scheduler address such as 'tcp://host:8786', got {address!r}")
    try:
        from distributed import Client, as_completed
    except ImportError as exc:  # pragma: no cover - distributed is a dependency
        raise ConfigError(f"cluster={address!r} needs the 'distributed' package: {exc}") from exc
    try:
        client = Client(address, timeout=timeout_s)
    except OSError as exc:
        raise ConfigError(f"cluster: cannot reach the Dask scheduler at {address!r}: {exc}") from exc
    try:
        futures = client.map(fn, list(tasks), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results = [None] * len(futures)
        for fut in as_completed(futures):
            i = index[fut.key]
            results[i] = fut.result()
            if on_done is not None:
                on_done(i, results[i])
        return results
    finally:
        client.close()

"""Cluster topologies as NetworkX graphs with bandwidth (bytes/s) and latency (s) on every link."""
__all__: list[str] = []

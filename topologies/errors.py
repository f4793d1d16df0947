"""Exceptions of :mod:`topologies`. Every message names the bad part, field, node or edge."""
from __future__ import annotations


class TopologyError(Exception):
    """Base class of every error raised by :mod:`topologies`."""


class SpecError(TopologyError, ValueError):
    """A spec string, a unit string, a builder argument or a description file is not understood."""


class ValidationError(TopologyError, ValueError):
    """A graph breaks the topology conventions (kind, rank, bandwidth, latency, connectivity)."""


class RoutingError(TopologyError, LookupError):
    """No route: an unknown node, or two nodes in different parts of a partitioned graph."""

"""Exceptions of :mod:`qsgd`. Every message names the bad field and its value."""
from __future__ import annotations


class QSGDError(Exception):
    """Base class of every error raised by :mod:`qsgd`."""


class ConfigError(QSGDError, ValueError):
    """A configuration field is out of range or of the wrong type."""


class PayloadError(QSGDError, ValueError):
    """A payload is truncated, extended, corrupted or otherwise not decodable."""


class TraceError(QSGDError, ValueError):
    """A payload trace file is malformed; the message names the field (a JSON path)."""


class ModelError(QSGDError, ValueError):
    """A model name or import path does not name a buildable ``torch.nn.Module``."""


class HookError(QSGDError, RuntimeError):
    """The DDP communication hook cannot proceed (ranks disagree, a peer is gone, ...)."""

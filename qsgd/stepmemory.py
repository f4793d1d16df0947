"""Whether a measured training step can fit the device it would run on, asked before building.

:func:`qsgd.measure` runs real steps: the model's weights, their gradients and SGD's momentum
buffer (4 bytes each per parameter in fp32) are resident at once, before any activation or
codec buffer. A 7B-parameter decoder needs 81 GB of that alone; on a 24 GB machine building
it was killed by the kernel a minute later, with nothing said. :func:`check_fits` refuses up
front, in one line, with what would fit instead (the meta device records the layout and the
operators without running anything).

The memory free now is read from the operating system (Linux's ``MemAvailable``) or from
CUDA (``torch.cuda.mem_get_info``); where neither says, nothing is refused. A refusal
depends on the machine, a prediction never does: a trace measured here is the same input
wherever it is studied.
"""
from __future__ import annotations

import torch

from qsgd.errors import ConfigError

__all__ = ["STEP_BYTES_PER_PARAMETER", "available_bytes", "check_fits"]

#: Bytes a measured step keeps per parameter before activations: the fp32 weight, its
#: gradient and SGD's momentum (``qsgd.measure`` steps ``torch.optim.SGD(momentum=0.9)``).
STEP_BYTES_PER_PARAMETER = 3 * 4


def available_bytes(device: torch.device) -> int | None:
    """Bytes free for a new allocation on ``device`` now: Linux's ``MemAvailable`` for the
    CPU, ``torch.cuda.mem_get_info`` for a CUDA device; None where it cannot be read.

    >>> import torch
    >>> n = available_bytes(torch.device("cpu"))
    >>> n is None or n > 0
    True
    """
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024       # the file's unit is kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(name: str, parameters: int, device: torch.device,
               available: int | None = None) -> None:
    """Refuse to measure model ``name`` of ``parameters`` on ``device`` when its step's
    weights, gradients and momentum (:data:`STEP_BYTES_PER_PARAMETER` each) exceed the
    ``available`` bytes (default: :func:`available_bytes` now).

    Raises
    ------
    ConfigError
        One line: the model, what its step needs, what the device has, what to do instead.

    Examples
    --------
    >>> import torch
    >>> check_fits("mlp", 235_146, torch.device("cpu"), available=10**9)   # 2.8 MB: fits
    >>> check_fits("llama2-70b", 68_976_648_192, torch.device("cpu"), available=24 * 10**9)
    Traceback (most recent call last):
    ...
    qsgd.errors.ConfigError: model 'llama2-70b' has 68,976,648,192 parameters: a measured step on cpu holds at least 827.7 GB (fp32 weights, gradients and momentum), more than the 24.0 GB free there; record its layout and operators without running it on the meta device (device 'meta'), or measure it where it fits
    """
    free = available_bytes(device) if available is None else available
    need = STEP_BYTES_PER_PARAMETER * int(parameters)
    if free is None or need <= free:
        return
    raise ConfigError(f"model {name!r} has {int(parameters):,} parameters: a measured step on "
                      f"{device} holds at least {need / 1e9:.1f} GB (fp32 weights, gradients "
                      f"and momentum), more than the {free / 1e9:.1f} GB free there; record its "
                      f"layout and operators without running it on the meta device (device "
                      f"'meta'), or measure it where it fits")

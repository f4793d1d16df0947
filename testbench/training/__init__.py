"""Real distributed training with DDP and a gradient-compression hook (``qsgd-emu train``).

:mod:`.datasets` holds the offline datasets, :mod:`.compression` the hook registry (fp32,
fp16, PowerSGD, QSGD), :mod:`.loop` the training loop that logs into the run store, and
:mod:`.launch` the process-group set-up (torchrun, ``--spawn N``, or a single process).
"""

"""Sub-command modules of ``qsgd-emu``: each has ``add_arguments(parser)`` and ``run(args)``."""

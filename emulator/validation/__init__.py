"""Validation of the emulator against real runs: the maths, not the runs.

Real collectives and training steps (measured by :mod:`testbench`, or NVIDIA nccl-tests logs
read by :func:`import_nccl_tests`) arrive as a :class:`MeasuredTrace`; :func:`calibrate` fits
link latency and bandwidth per link class; :func:`compare` predicts the other points with the
emulator and scores them in a :class:`ValidationReport`. :func:`validate_compute` checks the
compute model against published single-GPU training throughput, and
:func:`validate_attention` its attention kernels against FlashAttention-2's end-to-end table.
:func:`validate_published` predicts the registry of published multi-GPU training runs
(:func:`load_published`) with the project's defaults.
"""
from .attention import AttentionCase, load_attention_cases, validate_attention
from .calibrate import Calibration, calibrate
from .compute import ComputeCase, load_cases as load_compute_cases, predict_case, validate_compute
from .compare import ValidationReport, compare
from .nccl_tests import import_nccl_tests
from .published import PublishedPoint, PublishedRun, load_registry as load_published, \
    load_run as load_published_run
from .publishedrun import validate_published
from .publishedtable import COLUMNS as PUBLISHED_COLUMNS, summary_lines as published_summary, \
    table_rows as published_rows, text_lines as published_text, to_html as published_html
from .trace import CollectivePoint, MeasuredTrace, TrainingPoint

__all__ = ["MeasuredTrace", "CollectivePoint", "TrainingPoint", "ValidationReport",
           "import_nccl_tests", "Calibration", "calibrate", "compare", "ComputeCase",
           "load_compute_cases", "predict_case", "validate_compute", "PublishedRun",
           "PublishedPoint", "load_published", "load_published_run", "validate_published",
           "PUBLISHED_COLUMNS", "published_rows", "published_summary", "published_text",
           "published_html", "AttentionCase", "load_attention_cases", "validate_attention"]

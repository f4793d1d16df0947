"""Project-wide test configuration."""
import os

# Two cores: keep each test process from oversubscribing them with intra-op threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

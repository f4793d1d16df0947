"""Datasets available offline: scikit-learn's digits (shipped inside the package) and a seeded
synthetic Gaussian mixture. No downloads, deterministic splits."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass(frozen=True)
class Dataset:
    """A classification dataset split into train and test tensors (float32 features, int64 labels)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def n_features(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def n_classes(self) -> int:
        return int(max(self.train_y.max(), self.test_y.max())) + 1


def _split(name: str, x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float) -> Dataset:
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    tx = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    ty = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    return Dataset(name, tx[train], ty[train], tx[test], ty[test])


def digits(seed: int = 0, test_fraction: float = 0.25) -> Dataset:
    """scikit-learn's 8x8 handwritten digits (1797 samples, 64 features in [0, 1], 10 classes)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return _split("digits", data.data / 16.0, data.target, seed, test_fraction)


def synthetic(seed: int = 0, test_fraction: float = 0.25, *, samples: int = 4000,
              features: int = 64, classes: int = 10, noise: float = 1.5) -> Dataset:
    """A seeded Gaussian mixture: one random unit-scale centre per class plus isotropic noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (classes, features))
    y = rng.integers(0, classes, samples)
    x = centres[y] + rng.normal(0.0, noise / np.sqrt(features) * 4, (samples, features))
    return _split("synthetic", x, y, seed + 1, test_fraction)


#: name -> loader(seed, test_fraction) -> Dataset
DATASETS: dict[str, Callable[..., Dataset]] = {"digits": digits, "synthetic": synthetic}


def load_dataset(name: str, seed: int = 0, test_fraction: float = 0.25) -> Dataset:
    """The dataset ``name`` (a key of :data:`DATASETS`) with a split chosen by ``seed``."""
    if name not in DATASETS:
        raise ValueError(f"dataset: unknown dataset {name!r}; known: {sorted(DATASETS)}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must be in (0, 1), got {test_fraction!r}")
    return DATASETS[name](seed, test_fraction)

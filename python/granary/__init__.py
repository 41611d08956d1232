"""Granary's Python client: iterate the batches of a pipeline that Granary serves.

>>> import granary
>>> for batch in granary.Pipeline("imagenet-resnet50", dispatcher="127.0.0.1:7070"):
...     images, labels = batch["image"], batch["label"]   # NumPy arrays, no copy

``granary.torch.IterableDataset`` wraps a pipeline for ``torch.utils.data.DataLoader``; it is
imported on first use, and torch is not a dependency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from granary._pipeline import STATE_VERSION, Batch, Pipeline
from granary.errors import (
    ConfigurationError,
    DataError,
    DispatcherUnavailable,
    GranaryError,
    InvalidPosition,
    PipelineFailed,
    PipelineNotFound,
    RequestRefused,
)

if TYPE_CHECKING:
    from granary import torch as torch

__version__ = "0.1.0"

__all__ = [
    "STATE_VERSION",
    "Batch",
    "ConfigurationError",
    "DataError",
    "DispatcherUnavailable",
    "GranaryError",
    "InvalidPosition",
    "Pipeline",
    "PipelineFailed",
    "PipelineNotFound",
    "RequestRefused",
]


def __getattr__(name: str) -> Any:
    # `granary.torch` imports torch, so it is loaded on first access only.
    if name == "torch":
        return importlib.import_module("granary.torch")
    raise AttributeError(f"module 'granary' has no attribute {name!r}")

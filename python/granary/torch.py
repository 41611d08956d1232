"""PyTorch integration: a Granary pipeline as a ``torch.utils.data.IterableDataset``.

>>> from torch.utils.data import DataLoader
>>> from granary.torch import IterableDataset
>>> dataset = IterableDataset("imagenet-resnet50")
>>> loader = DataLoader(dataset, batch_size=None)   # Granary batches; no re-batching
>>> for epoch in range(epochs):
...     for batch in loader:                        # one epoch per pass
...         images, labels = batch["image"], batch["label"]

Under ``torch.distributed`` (initialised before the first pass), each rank joins the job as
consumer ``rank`` of ``world_size``: each element reaches exactly one rank per epoch, and every
rank gets the same number of batches. ``state_dict()`` / ``load_state_dict()`` follow the
stateful-dataloader convention (torchdata's ``StatefulDataLoader`` calls them) and resume
mid-epoch.

Granary's workers do the parallel work: use ``num_workers=0`` (the default), so that the
iteration rhythm the client reports as the trainer's step and wait times is the training loop's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from granary._pipeline import Batch, Pipeline


def to_tensors(batch: Batch) -> dict[str, torch.Tensor]:
    """The batch's arrays as CPU tensors sharing their memory (no copy).

    The tensors view the received bytes, which nothing else reads; PyTorch's warning about
    non-writable NumPy arrays is silenced for this conversion. Moving them to an accelerator
    (``.to(device)``) copies as usual.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {name: torch.from_numpy(array) for name, array in batch.items()}


def _distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialised."""
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size()
    return None


class IterableDataset(torch.utils.data.IterableDataset[dict[str, Any]]):
    """A Granary pipeline for ``DataLoader(dataset, batch_size=None)``: each pass over it yields
    the batches of one epoch of the job, as dicts of tensors (or of NumPy arrays with
    ``tensors=False``).

    Args:
        name: The pipeline: ``metadata.name`` locally, ``namespace/name`` under Kubernetes.
        dispatcher: ``host:port``; default ``$GRANARY_DISPATCHER``.
        job: The job to join; default the pipeline's name.
        consumer_index: This consumer's index; default the ``torch.distributed`` rank when
            initialised, else the lowest free index.
        num_consumers: Consumers of the job; default the ``torch.distributed`` world size when
            initialised, else 1.
        mode: ``"distributed"`` (default) or ``"replicated"``.
        token: The pipeline's trainer token; see :class:`granary.Pipeline`.
        token_file: A file holding the token (not with ``token``); default
            ``$GRANARY_TOKEN_FILE``, else ``$GRANARY_TOKEN``.
        tls_ca: The CA certificate (PEM file) to dial TLS with; default ``$GRANARY_TLS_CA``.
        images: Where the fused image run's images are made: ``"auto"``, ``"client"`` or
            ``"workers"``; see :class:`granary.Pipeline`.
        prefetch_bytes: Memory for complete batches held ahead of the trainer; see
            :class:`granary.Pipeline`.
        tensors: Yield ``torch.Tensor`` values (default) or the NumPy arrays.
        keys: Also yield the elements' keys, as a list of strings under ``"__key__"`` (the
            WebDataset convention).
    """

    def __init__(
        self,
        name: str,
        dispatcher: str | None = None,
        *,
        job: str | None = None,
        consumer_index: int | None = None,
        num_consumers: int | None = None,
        mode: str = "distributed",
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        images: str | None = None,
        prefetch_bytes: int | None = None,
        tensors: bool = True,
        keys: bool = False,
    ) -> None:
        super().__init__()
        self._arguments = dict(
            name=name,
            dispatcher=dispatcher,
            job=job,
            mode=mode,
            token=token,
            token_file=token_file,
            tls_ca=tls_ca,
            images=images,
            prefetch_bytes=prefetch_bytes,
        )
        self._consumer_index = consumer_index
        self._num_consumers = num_consumers
        self._tensors = tensors
        self._keys = keys
        self._pipeline: Pipeline | None = None
        self._state: dict[str, Any] | None = None

    @property
    def pipeline(self) -> Pipeline:
        """The underlying :class:`granary.Pipeline`, created on first use with the rank and world
        size of ``torch.distributed`` if it is initialised by then."""
        if self._pipeline is None:
            consumer_index, num_consumers = self._consumer_index, self._num_consumers
            ranks = _distributed()
            if ranks is not None:
                rank, world_size = ranks
                consumer_index = rank if consumer_index is None else consumer_index
                num_consumers = world_size if num_consumers is None else num_consumers
            self._pipeline = Pipeline(
                consumer_index=consumer_index,
                num_consumers=num_consumers or 1,
                **self._arguments,
            )
            if self._state is not None:
                self._pipeline.load_state_dict(self._state)
                self._state = None
        return self._pipeline

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "DataLoader(num_workers>1): a Granary pipeline is already served by parallel "
                "workers, and each DataLoader worker would join as another consumer; use "
                "num_workers=0 (or 1)"
            )
        for batch in self.pipeline.epoch():
            item: dict[str, Any] = to_tensors(batch) if self._tensors else dict(batch)
            if self._keys:
                item["__key__"] = batch.element_keys
            yield item

    def state_dict(self) -> dict[str, Any]:
        """The pipeline's :meth:`granary.Pipeline.state_dict`: every batch yielded so far counts
        as delivered."""
        if self._pipeline is None and self._state is not None:
            return self._state
        return self.pipeline.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resumes from a :meth:`state_dict`, before the next pass."""
        if self._pipeline is None:
            self._state = state_dict
        else:
            self._pipeline.load_state_dict(state_dict)


__all__ = ["IterableDataset", "to_tensors"]

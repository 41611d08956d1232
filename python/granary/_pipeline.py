"""`granary.Pipeline`: a pipeline served by Granary, iterated as batches of NumPy arrays."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from granary import _native
from granary._arrays import to_array
from granary.errors import ConfigurationError, InvalidPosition

#: Version of the dict :meth:`Pipeline.state_dict` returns.
STATE_VERSION = 1


class Batch(dict[str, np.ndarray]):
    """One batch: the pipeline's tensors as NumPy arrays by name, leading axis the rows.

    The arrays are read-only views of the bytes received from the workers (no copy was made);
    ``array.copy()`` gives a writable one. ``torch.from_numpy`` and ``jax.numpy.asarray`` accept
    them as they are.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: _native.RawBatch) -> None:
        super().__init__(
            (name, to_array(dtype, shape, buffer)) for name, dtype, shape, buffer in raw.tensors()
        )
        self._raw = raw

    @property
    def epoch(self) -> int:
        """The epoch the batch belongs to, counted from 0."""
        return self._raw.epoch

    @property
    def slot(self) -> int:
        """The batch's slot in this consumer's plan of the epoch."""
        return self._raw.slot

    @property
    def rows(self) -> int:
        """Rows in the batch (the last round of an epoch may hold short or empty batches)."""
        return self._raw.rows

    @property
    def element_keys(self) -> list[str]:
        """The elements' keys (`object/index` of the source), in row order."""
        return self._raw.keys()

    @property
    def wire_bytes(self) -> int:
        """Tensor bytes the batch took on the wire."""
        return self._raw.wire_bytes

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}: {array.dtype}{list(array.shape)}" for name, array in self.items())
        return f"Batch(epoch={self.epoch}, slot={self.slot}, {{{fields}}})"


def _path(argument: str, value: str | os.PathLike[str] | None) -> str | None:
    """`value` as a path string; a :class:`ConfigurationError` naming `argument` if it is not
    a path."""
    if value is None:
        return None
    try:
        path = os.fspath(value)
    except TypeError:
        raise ConfigurationError(
            f"{argument}: expected a path (str or os.PathLike), got {type(value).__name__}"
        ) from None
    if not isinstance(path, str) or not path:
        raise ConfigurationError(f"{argument}: expected a non-empty path to a file, got {value!r}")
    return path


#: The values of ``Pipeline(images=...)``.
_IMAGE_PLACEMENTS = ("auto", "client", "workers")


class Pipeline:
    """A pipeline that a Granary dispatcher serves, read as batches of NumPy arrays.

    ``for batch in Pipeline("imagenet"):`` iterates every remaining batch of every epoch of the
    job, each element of an epoch exactly once; :meth:`epoch` iterates one epoch at a time. The
    connection is made on first use and closed by :meth:`close` (or ``with``).

    Args:
        name: The pipeline: ``metadata.name`` locally, ``namespace/name`` under Kubernetes.
        dispatcher: ``host:port`` of the dispatcher; default ``$GRANARY_DISPATCHER``.
        job: The job to join; default the pipeline's name. Consumers of one job share its
            epochs; another job reads the pipeline again from the start.
        consumer_index: This consumer's index in the job; default the lowest free one.
        num_consumers: Consumers of the job (fixed by its first consumer). Each element reaches
            exactly one of them per epoch, and each gets the same number of batches.
        mode: ``"distributed"`` (default) or ``"replicated"`` (every consumer sees every element).
        token: The pipeline's trainer token, for a dispatcher that authenticates its callers.
        token_file: A file holding that token instead (on Kubernetes, the pipeline's token
            Secret mounted as a file; locally the ``token_file`` that ``granary run --serve
            --tls`` prints). Give ``token`` or ``token_file``, not both; with neither, the file
            named by ``$GRANARY_TOKEN_FILE`` is read, else ``$GRANARY_TOKEN``, else no token is
            sent.
        tls_ca: The CA certificate (PEM file) the dispatcher's and workers' certificates chain
            to: the client dials them over TLS and checks their certificates against it. Default
            ``$GRANARY_TLS_CA``, else plaintext.
        images: Where the images of the pipeline's fused image run (decode, crop or resize,
            flip) are made: ``"auto"`` (default: the dispatcher moves a share of them to this
            host while it has idle cores, and back to the workers when it has none),
            ``"client"`` (all on this host) or ``"workers"``. The pixels are the same bytes
            either way. Default ``$GRANARY_IMAGES``, else ``"auto"``.
        prefetch_bytes: Memory the client may hold in complete batches ahead of the trainer. It
            holds 4 at first, and twice as many each time the trainer finds a full buffer
            emptied (the workers deliver in bursts), as long as that many of the largest batch
            fit, up to 64. Default 1 GiB; ``0`` keeps 4.

    Explicit arguments override the environment. The token file and the CA are read each time
    the pipeline connects (a rotated Secret is picked up on reconnecting); one that cannot be
    read raises :class:`~granary.errors.ConfigurationError` naming its path.

    The trainer's step time (between batches) and wait time (inside ``next``) are measured from
    the iteration and reported to the dispatcher, which the autoscaler sizes the workers by.
    """

    def __init__(
        self,
        name: str,
        dispatcher: str | None = None,
        *,
        job: str | None = None,
        consumer_index: int | None = None,
        num_consumers: int = 1,
        mode: str = "distributed",
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        images: str | None = None,
        prefetch_bytes: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("name: give the pipeline's name, e.g. Pipeline('imagenet')")
        if mode not in ("distributed", "replicated"):
            raise ConfigurationError(f'mode: {mode!r} is not a mode; use "distributed" or "replicated"')
        if not isinstance(num_consumers, int) or num_consumers < 1:
            raise ConfigurationError(f"num_consumers: {num_consumers!r} must be an integer of at least 1")
        if consumer_index is not None and not 0 <= consumer_index < num_consumers:
            raise ConfigurationError(
                f"consumer_index: {consumer_index!r} must be in 0..{num_consumers - 1} "
                f"for num_consumers={num_consumers}"
            )
        if images is not None and images not in _IMAGE_PLACEMENTS:
            raise ConfigurationError(
                f'images: {images!r} is not a placement; use "auto", "client" or "workers"'
            )
        if prefetch_bytes is not None and (
            not isinstance(prefetch_bytes, int) or isinstance(prefetch_bytes, bool) or prefetch_bytes < 0
        ):
            raise ConfigurationError(
                f"prefetch_bytes: {prefetch_bytes!r} must be a number of bytes, 0 or more "
                "(e.g. 2 << 30 for 2 GiB; 0 holds 4 batches ahead)"
            )
        if token is not None and token_file is not None:
            raise ConfigurationError(
                "token and token_file are both given; pass the token or the file holding it, not both"
            )
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigurationError(
                "token: expected the pipeline's trainer token as a non-empty string; "
                "or leave it out to read GRANARY_TOKEN_FILE or GRANARY_TOKEN"
            )
        self.name = name
        self.dispatcher = dispatcher
        self.job = job
        self.consumer_index = consumer_index
        self.num_consumers = num_consumers
        self.mode = mode
        #: Where the fused image run's images are made (``None``: ``$GRANARY_IMAGES``, else auto).
        self.images = images
        #: Memory for batches held ahead of the trainer (``None``: 1 GiB).
        self.prefetch_bytes = prefetch_bytes
        #: The token file, if given (the token itself is kept private and out of ``repr``).
        self.token_file = _path("token_file", token_file)
        #: The CA certificate file, if given.
        self.tls_ca = _path("tls_ca", tls_ca)
        self._token = token
        self._client: _native.Client | None = None
        self._resume: bytes | None = None

    # -- connection ---------------------------------------------------------------------------

    @property
    def client(self) -> _native.Client:
        """The connected client (connecting now if needed)."""
        if self._client is None:
            self._client = _native.Client(
                self.name,
                self.dispatcher,
                job=self.job,
                consumer_index=self.consumer_index,
                num_consumers=self.num_consumers,
                mode=self.mode,
                position=self._resume,
                token=self._token,
                token_file=self.token_file,
                tls_ca=self.tls_ca,
                images=self.images,
                prefetch_bytes=self.prefetch_bytes,
            )
        return self._client

    def close(self) -> None:
        """Disconnects; the next use connects again, resuming from :meth:`state_dict`."""
        if self._client is not None:
            self._resume = self._client.checkpoint()
            self._client.close()
            self._client = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        raw = self.client.next()
        if raw is None:
            raise StopIteration
        return Batch(raw)

    def epoch(self) -> Iterator[Batch]:
        """The batches of the epoch in progress (or the next one, once it is finished), then
        stops: ``for epoch in range(n): for batch in pipeline.epoch(): ...``. Yields nothing
        after the job's last epoch. It stops when the client has delivered the epoch's last
        batch, so nothing of the next epoch is read ahead."""
        client = self.client
        raw = client.next()
        while raw is not None:
            yield Batch(raw)
            if client.epoch_finished:
                return
            raw = client.next()

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this consumer is: every batch returned so far counts as delivered. Store it with
        the training checkpoint; :meth:`load_state_dict` (in this or a new process) goes on from
        there, mid-epoch included, and no element is delivered twice or skipped."""
        position = self._resume if self._client is None else self._client.checkpoint()
        return {
            "version": STATE_VERSION,
            "pipeline": self.name,
            "position": None if position is None else position.decode(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resumes from a :meth:`state_dict`: the next batch is the first one not delivered
        then. Call it before iterating (an open connection is closed first)."""
        if not isinstance(state_dict, dict) or state_dict.get("version") != STATE_VERSION:
            raise InvalidPosition(
                f"state_dict: not a Granary pipeline state (expected a dict with version {STATE_VERSION})"
            )
        if state_dict.get("pipeline") != self.name:
            raise InvalidPosition(
                f"state_dict['pipeline']: the state is of pipeline {state_dict.get('pipeline')!r}, "
                f"this is {self.name!r}"
            )
        position = state_dict.get("position")
        if position is not None and not isinstance(position, str):
            raise InvalidPosition("state_dict['position']: expected the string state_dict() wrote")
        if self._client is not None:
            self._client.close()
            self._client = None
        self._resume = None if position is None else position.encode()

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, dispatcher={self.dispatcher!r}, job={self.job!r})"

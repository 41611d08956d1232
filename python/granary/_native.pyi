"""Type stubs of the Rust extension module (see python/src)."""

import os

DISPATCHER_ENV: str
POSITION_VERSION: int

class TensorBuffer:
    """Read-only bytes of one received tensor, exported through the buffer protocol."""

    @property
    def address(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class RawBatch:
    """A batch as received."""

    @property
    def epoch(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def wire_bytes(self) -> int: ...
    def keys(self) -> list[str]: ...
    def tensors(self) -> list[tuple[str, str, tuple[int, ...], TensorBuffer]]: ...

class DrainReport:
    """What `Client.drain` received."""

    batches: int
    rows: int
    bytes: int
    wire_bytes: int
    digests: dict[tuple[int, str], str] | None

class Client:
    """One consumer of a Granary job."""

    def __init__(
        self,
        pipeline: str,
        dispatcher: str | None = None,
        *,
        job: str | None = None,
        consumer_index: int | None = None,
        num_consumers: int = 1,
        mode: str = "distributed",
        position: bytes | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        images: str | None = None,
        prefetch_bytes: int | None = None,
    ) -> None:
        """Joins the job. `token` or `token_file` (not both) is the trainer token, default
        ``$GRANARY_TOKEN_FILE``, else ``$GRANARY_TOKEN``; `tls_ca` the CA certificate (PEM)
        to dial TLS with, default ``$GRANARY_TLS_CA``, else plaintext. Files are read now;
        one that cannot be read raises ``ConfigurationError`` naming its path. `images` is
        where the fused image run's images are made: ``"auto"``, ``"client"`` or
        ``"workers"``; default ``$GRANARY_IMAGES``, else ``"auto"``. `prefetch_bytes` is the
        memory for complete batches held ahead of the trainer (default 1 GiB; 0 holds 4)."""
        ...
    def next(self) -> RawBatch | None: ...
    def drain(self, max_batches: int | None = None, *, digests: bool = False) -> DrainReport: ...
    def checkpoint(self) -> bytes: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def pipeline(self) -> str: ...
    @property
    def job(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def epochs(self) -> int: ...
    @property
    def consumer_index(self) -> int: ...
    @property
    def num_consumers(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def epoch_finished(self) -> bool: ...
    @property
    def prefetch_batches(self) -> int: ...
    @property
    def duplicates(self) -> int: ...

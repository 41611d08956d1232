"""Helpers to check what a client received: digests that the Rust client computes the same way
(``granary._native.Client.drain(digests=True)``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any


def element_digests(batches: Iterable[Any]) -> dict[tuple[int, str], str]:
    """SHA-256 (hex) of each element's rows, by ``(epoch, element key)``: for every tensor of the
    batch, in order, its name and the bytes of the element's row."""
    digests: dict[tuple[int, str], str] = {}
    for batch in batches:
        arrays: Mapping[str, Any] = batch
        for row, key in enumerate(batch.element_keys):
            hasher = hashlib.sha256()
            for name, array in arrays.items():
                hasher.update(name.encode())
                hasher.update(array[row].tobytes())
            digests[(batch.epoch, key)] = hasher.hexdigest()
    return digests


__all__ = ["element_digests"]

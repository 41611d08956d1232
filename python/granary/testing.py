"""Helpers for tests and benchmarks of the client: a local service to read from, and digests of
what a client received that the Rust client computes the same way
(``granary._native.Client.drain(digests=True)``)."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalService:
    """A running ``granary run MANIFEST --serve``: the dispatcher in that process, its workers as
    child processes, all on 127.0.0.1."""

    #: ``host:port`` of the dispatcher.
    dispatcher: str
    #: The pipeline's name.
    pipeline: str
    #: ``host:port`` of its Prometheus metrics, if asked for.
    metrics: str | None
    process: subprocess.Popen[str]
    #: With ``--tls``: the CA certificate (PEM) its dispatcher's and workers' certificates chain to.
    tls_ca: str | None = None
    #: With ``--tls``: the file holding the pipeline's trainer token.
    token_file: str | None = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    binary: str,
    manifest: str | Path,
    *,
    workers: int = 2,
    options: Sequence[str] = (),
    metrics: bool = False,
    log: Path | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> LocalService:
    """Starts ``BINARY run MANIFEST --serve 127.0.0.1:0 --workers N [OPTIONS]`` and waits (at
    most `timeout` seconds) for the line naming its dispatcher. With `metrics`, it also serves
    Prometheus metrics on a free port; its log goes to `log` (else nowhere). With ``--tls`` among
    the options, the service's CA and trainer token file are its ``tls_ca`` and ``token_file``."""
    command = [binary, "run", str(manifest), "--serve", "127.0.0.1:0", "--workers", str(workers), *options]
    metrics_address = f"127.0.0.1:{free_port()}" if metrics else None
    if metrics_address is not None:
        command += ["--metrics-addr", metrics_address]
    stderr = log.open("w") if log is not None else subprocess.DEVNULL
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines: list[str] = []
    stdout = process.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=timeout)
    if not lines or not lines[0].strip():
        process.kill()
        process.wait(timeout=15)
        tail = log.read_text()[-4000:] if log is not None else "(no log kept)"
        raise RuntimeError(f"{' '.join(command)} printed no dispatcher address; its log:\n{tail}")
    ready = json.loads(lines[0])
    return LocalService(
        ready["dispatcher"],
        ready["pipeline"],
        metrics_address,
        process,
        tls_ca=ready.get("tls_ca"),
        token_file=ready.get("token_file"),
    )


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


__all__ = ["LocalService", "element_digests", "free_port", "serve"]

"""A real local Granary service for the Python client's tests: `granary demo` data, and
`granary run --serve` (the dispatcher in that process, worker processes) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Images the demo data holds; every epoch delivers each once.
IMAGES = 48
#: Rows in a full batch.
BATCH = 8
#: Epochs of the job.
EPOCHS = 2

MANIFEST = """\
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata:
  name: pytest-images
spec:
  source:
    url: file:{data}/images-wds/
    format: webdataset
  stages:
    - op: image.decode
    - op: image.random_resized_crop
      size: 32
    - op: image.flip
    - op: image.normalize
      dtype: uint8
      layout: HWC
  shuffle:
    buffer: 64
  batch:
    size: {batch}
  seed: 7
  epochs: {epochs}
"""


def granary_binary() -> str:
    """`$GRANARY_BIN`, else the workspace's debug or release build, else `granary` on PATH."""
    candidates = [os.environ.get("GRANARY_BIN", "")]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    candidates += [str(target / "debug" / "granary"), str(target / "release" / "granary")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("granary")
    if found is None:
        pytest.fail("no granary binary: build it with `cargo build -p granary-cli` or set GRANARY_BIN")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    """A running `granary run --serve`."""

    dispatcher: str
    pipeline: str
    metrics: str
    process: subprocess.Popen[str]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def start_service(binary: str, manifest: Path, log: Path, *, workers: int = 2) -> Service:
    """Starts the service and waits (at most 120 s) for the line naming its dispatcher."""
    metrics = f"127.0.0.1:{free_port()}"
    command = [binary, "run", str(manifest), "--serve", "127.0.0.1:0", "--workers", str(workers)]
    command += ["--metrics-addr", metrics]
    stderr = log.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=120)
    if not lines or not lines[0].strip():
        process.kill()
        pytest.fail(f"granary run --serve printed no address; its log:\n{log.read_text()[-4000:]}")
    ready = json.loads(lines[0])
    return Service(ready["dispatcher"], ready["pipeline"], metrics, process, log)


@pytest.fixture(scope="session")
def binary() -> str:
    return granary_binary()


@pytest.fixture(scope="session")
def demo_data(binary: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("demo")
    subprocess.run(
        [binary, "demo", "--dir", str(data), "--images", str(IMAGES), "--no-run"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return data


@pytest.fixture(scope="session")
def service(binary: str, demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("service")
    manifest = folder / "pipeline.yaml"
    manifest.write_text(MANIFEST.format(data=demo_data, batch=BATCH, epochs=EPOCHS))
    service = start_service(binary, manifest, folder / "granary.log")
    yield service
    service.stop()


@pytest.fixture
def run_python() -> Iterator[object]:
    """Runs a Python script in a new process (this interpreter), returning its stdout."""

    def run(script: Path, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            pytest.fail(f"{script.name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    yield run


def wait_for(predicate, timeout: float, every: float = 0.2) -> bool:
    """Polls `predicate` until it holds or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()

"""A real local Granary service for the Python client's tests: `granary demo` data, and
`granary run --serve` (the dispatcher in that process, worker processes) on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from granary.testing import LocalService, serve

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


def start_service(binary: str, manifest: Path, log: Path, *, workers: int = 2) -> LocalService:
    """The service, with metrics; fails the test with its log when it does not start."""
    try:
        return serve(binary, manifest, workers=workers, metrics=True, log=log)
    except RuntimeError as error:
        pytest.fail(str(error))


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
def service(binary: str, demo_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
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

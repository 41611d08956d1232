"""Batches/s and GB/s into Python against the Rust client, in the same run.

    cargo build --release -p granary-cli
    target/release/granary demo --no-run            # ./granary-demo, if not there yet
    pip install ./python
    python bench/python_client.py > python-client.jsonl

For each manifest it starts `granary run MANIFEST --serve` (the dispatcher in that process and
`--workers` worker processes) and reads the whole job `--rounds` times with each client, in
alternating order, each read as a new job of the same pipeline:

- **rust**: the Rust client (`granary._native.Client.drain`), which receives and assembles the
  batches and hands none to Python: the baseline;
- **python**: `granary.Pipeline`, every batch turned into a dict of NumPy arrays over the received
  buffers, and every array touched (its first byte read), as a training loop would.

It prints one JSON line per manifest with the medians of both and `vs_rust`, the ratio of the
Python client's batches/s to the Rust client's. Both read the same service, so when the workers
rather than the client limit the rate, that ratio is near 1 by construction. The line therefore
also gives `python_us_per_batch`, the time the Python side adds to each batch (building the dict
of arrays and touching them), timed apart in the same reads, and `client_bound_vs_rust`, the ratio
that cost alone would give at the Rust client's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import granary
from granary import _native
from granary.testing import LocalService, serve

ROOT = Path(__file__).resolve().parents[1]
# The manifests read by default, with the `granary run` options that make each read of the job
# long enough to time (a few seconds): small tabular batches, where per-batch overhead shows, and
# uint8 image batches, where bytes/s shows.
MANIFESTS = {
    "examples/parquet-features.yaml": ["--set", "spec.batch.size=64", "--epochs", "40"],
    "examples/imagenet-resnet50-uint8.yaml": ["--set", "spec.batch.size=32", "--epochs", "16"],
}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifests", nargs="*", default=list(MANIFESTS))
    parser.add_argument("--granary", default=None, help="the granary binary (default: target/release, PATH)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None, help="epochs per read of the job")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def binary(path: str | None) -> str:
    for candidate in (path, str(ROOT / "target/release/granary"), shutil.which("granary")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("no granary binary: cargo build --release -p granary-cli, or pass --granary")


def start(granary_bin: str, manifest: str, workers: int, epochs: int | None) -> LocalService:
    options = MANIFESTS.get(manifest, [])
    if epochs is not None:
        options = [o for i, o in enumerate(options) if o != "--epochs" and (i == 0 or options[i - 1] != "--epochs")]
        options += ["--epochs", str(epochs)]
    try:
        return serve(granary_bin, manifest, workers=workers, options=options, cwd=ROOT)
    except RuntimeError as error:
        sys.exit(f"{manifest}: {error} (is ./granary-demo there? `granary demo --no-run`)")


def read_rust(dispatcher: str, pipeline: str, job: str) -> tuple[float, int, int, float]:
    client = _native.Client(pipeline, dispatcher, job=job)
    started = time.perf_counter()
    report = client.drain()
    seconds = time.perf_counter() - started
    client.close()
    return seconds, report.batches, report.bytes, 0.0


def read_python(dispatcher: str, pipeline: str, job: str) -> tuple[float, int, int, float]:
    """Reads the job as `for batch in granary.Pipeline(...)` does, timing apart the Python side
    of each batch (the dict of NumPy arrays over the received buffers, and touching them)."""
    batches = received = 0
    python_seconds = 0.0
    with granary.Pipeline(pipeline, dispatcher, job=job) as source:
        client = source.client  # connect before the clock starts, as the Rust read does
        started = time.perf_counter()
        while (raw := client.next()) is not None:
            converting = time.perf_counter()
            batch = granary.Batch(raw)
            for array in batch.values():
                if array.size:
                    array.flat[0]  # touch it
                received += array.nbytes
            python_seconds += time.perf_counter() - converting
            batches += 1
        seconds = time.perf_counter() - started
    return seconds, batches, received, python_seconds


def main() -> None:
    args = arguments()
    granary_bin = binary(args.granary)
    for manifest in args.manifests:
        service = start(granary_bin, manifest, args.workers, args.epochs)
        figures: dict[str, list[tuple[float, float]]] = {"rust": [], "python": []}
        python_us_per_batch: list[float] = []
        try:
            for round_ in range(args.rounds):
                order = [("rust", read_rust), ("python", read_python)]
                for name, read in order if round_ % 2 == 0 else order[::-1]:
                    seconds, batches, received, python_seconds = read(
                        service.dispatcher, service.pipeline, f"{name}-{round_}"
                    )
                    figures[name].append((batches / seconds, received / seconds / 1e9))
                    if name == "python":
                        python_us_per_batch.append(python_seconds / batches * 1e6)
                    print(f"{manifest} round {round_} {name}: {batches} batches, {batches / seconds:.1f}/s, "
                          f"{received / seconds / 1e9:.3f} GB/s", file=sys.stderr)
        finally:
            service.stop()
        median = {name: (statistics.median(b for b, _ in values), statistics.median(g for _, g in values))
                  for name, values in figures.items()}
        print(json.dumps({
            "system": "granary",
            "benchmark": "python_client",
            "pipeline": service.pipeline,
            "workers": args.workers,
            "options": " ".join(MANIFESTS.get(manifest, [])) if args.epochs is None else f"--epochs {args.epochs}",
            "rounds": args.rounds,
            "rust_batches_per_s": round(median["rust"][0], 1),
            "rust_gb_per_s": round(median["rust"][1], 4),
            "python_batches_per_s": round(median["python"][0], 1),
            "python_gb_per_s": round(median["python"][1], 4),
            "vs_rust": round(median["python"][0] / median["rust"][0], 3),
            # What Python adds per batch, and the ratio it would give a client-bound read at the
            # Rust client's measured rate: 1 / (1 + added time x Rust batches/s).
            "python_us_per_batch": round(statistics.median(python_us_per_batch), 1),
            "client_bound_vs_rust": round(
                1 / (1 + statistics.median(python_us_per_batch) * 1e-6 * median["rust"][0]), 3
            ),
        }), flush=True)


if __name__ == "__main__":
    main()

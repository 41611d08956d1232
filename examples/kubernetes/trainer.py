"""Read one epoch of a pipeline that a Granary operator serves, with the PyTorch client, and
report what arrived: batches, elements, and the element shapes.

    GRANARY_DISPATCHER=granary-dispatcher.granary.svc:7070 \\
    GRANARY_PIPELINE=ml-team/imagenet-s3 python trainer.py

Both come from the InputPipeline's `status.endpoint`. A real trainer would step its model where
this one counts; the client reports the loop's step and wait times to the autoscaler either way.
"""

from __future__ import annotations

import argparse
import os
import time

from torch.utils.data import DataLoader

from granary.torch import IterableDataset


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatcher", default=os.environ.get("GRANARY_DISPATCHER"), help="host:port")
    parser.add_argument("--pipeline", default=os.environ.get("GRANARY_PIPELINE"), help="<namespace>/<name>")
    parser.add_argument("--job", default=os.environ.get("GRANARY_JOB"), help="default: the pipeline's key")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if not args.dispatcher or not args.pipeline:
        raise SystemExit("give --dispatcher and --pipeline (or GRANARY_DISPATCHER and GRANARY_PIPELINE)")
    dataset = IterableDataset(args.pipeline, dispatcher=args.dispatcher, job=args.job)
    loader = DataLoader(dataset, batch_size=None)
    started = time.monotonic()
    batches = elements = 0
    shapes: dict[str, tuple[int, ...]] = {}
    for batch in loader:
        batches += 1
        first = next(iter(batch.values()))
        elements += int(first.shape[0])
        for field, tensor in batch.items():
            shapes.setdefault(field, tuple(tensor.shape[1:]))
    seconds = time.monotonic() - started
    fields = ", ".join(f"{name} {list(shape)}" for name, shape in sorted(shapes.items()))
    print(f"epoch done: {batches} batches, {elements} elements in {seconds:.1f} s ({fields})", flush=True)


if __name__ == "__main__":
    main()

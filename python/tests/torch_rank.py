"""One rank of the torch.distributed test: joins the process group (gloo, from the env://
variables), reads one epoch through granary.torch.IterableDataset and prints what it got."""

from __future__ import annotations

import json
import sys

import torch.distributed
from torch.utils.data import DataLoader

from granary.torch import IterableDataset


def main() -> None:
    dispatcher, pipeline, job = sys.argv[1:4]
    torch.distributed.init_process_group("gloo", init_method="env://")
    dataset = IterableDataset(pipeline, dispatcher, job=job, keys=True)
    keys: list[str] = []
    batches = 0
    for batch in DataLoader(dataset, batch_size=None):
        keys += batch["__key__"]
        batches += 1
    client = dataset.pipeline.client
    report = {"consumer": [client.consumer_index, client.num_consumers], "batches": batches, "keys": keys}
    print(json.dumps(report))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch DataLoader peer of Granary's validation recipe (bench/imagenet-val-float32.yaml).

The ImageNet evaluation transform on the peers' data and loader settings (their
peers/torch_loader.py: read JPEG bytes -> torchvision decode_jpeg, default collate into batches
of 128, num_workers = cores, steady state seen by the main process), with the train recipe's
crop and flip replaced by the evaluation's:

  v2.Resize(256, antialias) -> v2.CenterCrop(224) -> [ToDtype(float32, scale) + Normalize]

Configs (--config, repeatable; default: float32):
  float32   the recipe above, float32 CHW normalized
  uint8     without the normalization, uint8 CHW

It imports the peers' own helpers (common.py, torch_loader.py) from $PEERS_DIR/peers (the peer
benchmarks' folder; required) and prints their JSON line format, with `pipeline`
image-resize256-center224.
"""
import os
import sys

PEERS_DIR = os.environ.get("PEERS_DIR", "")
if not PEERS_DIR:
    sys.exit("set PEERS_DIR to the peer benchmarks' folder (it holds peers/torch_loader.py)")
sys.path.insert(0, os.path.join(PEERS_DIR, "peers"))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from common import load_labels  # noqa: E402
from loader_run import arguments, folder_loader, run, transform  # noqa: E402
from torch_loader import FolderDataset, decode_tv  # noqa: E402

PIPELINE = "image-resize256-center224"


def build_loader(cfg, data, batch, workers, total_batches, seed):
    steps = transform([v2.Resize(256, antialias=True), v2.CenterCrop(224)], cfg == "float32")
    ds = FolderDataset(load_labels(data), decode_tv, steps)
    return folder_loader(ds, batch, workers, total_batches, seed)


def main():
    a = arguments(__doc__, ["float32", "uint8"], ["float32"])
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    run(a, lambda cfg: PIPELINE, build_loader, versions)


if __name__ == "__main__":
    main()

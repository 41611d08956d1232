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
import argparse
import os
import sys

PEERS_DIR = os.environ.get("PEERS_DIR", "")
if not PEERS_DIR:
    sys.exit("set PEERS_DIR to the peer benchmarks' folder (it holds peers/torch_loader.py)")
sys.path.insert(0, os.path.join(PEERS_DIR, "peers"))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from common import DEFAULT_DATA, IMAGENET_MEAN, IMAGENET_STD, cores, emit, error, load_labels, log, measure  # noqa: E402
from torch_loader import FolderDataset, decode_tv  # noqa: E402

SYSTEM = "pytorch-dataloader"
PIPELINE = "image-resize256-center224"


def make_transform(normalize):
    t = [v2.Resize(256, antialias=True), v2.CenterCrop(224)]
    if normalize:
        t += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    else:
        t += [v2.ToImage()]
    return v2.Compose(t)


def build_loader(cfg, data, batch, workers, total_batches, seed):
    ds = FolderDataset(load_labels(data), decode_tv, make_transform(cfg == "float32"))
    kw = dict(batch_size=batch, num_workers=workers, drop_last=True, pin_memory=False, persistent_workers=False)
    if workers > 0:
        kw["prefetch_factor"] = 2
    # The same sampling as the train recipe's peer: the order does not change the work per image.
    g = torch.Generator().manual_seed(seed)
    sampler = RandomSampler(ds, replacement=False, num_samples=total_batches * batch, generator=g)
    return DataLoader(ds, sampler=sampler, **kw), {"dataset_size": len(ds)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--config", action="append", choices=["float32", "uint8"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=cores())
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches")
    ap.add_argument("--batches", type=int, default=30, help="timed batches")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    for cfg in a.config or ["float32"]:
        try:
            loader, info = build_loader(cfg, a.data, a.batch, a.workers, a.warmup + a.batches + 1, a.seed)
            it = iter(loader)
            items, dt, first = measure(it, a.warmup, a.batches, lambda b: b[0].shape[0])
            del it
            emit(SYSTEM, PIPELINE, cfg, items, dt, a.batches, batch_size=a.batch, workers=a.workers,
                 warmup_batches=a.warmup, first_batch_s=round(first or 0, 3), layout="NCHW",
                 versions=versions, **info)
        except Exception as e:  # keep going with the other configs
            log(f"[{SYSTEM}/{cfg}] failed: {e!r}")
            error(SYSTEM, PIPELINE, cfg, e, versions=versions)


if __name__ == "__main__":
    main()

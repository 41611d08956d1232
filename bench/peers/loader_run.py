"""What Granary's DataLoader peers share (torch_jitter.py, torch_val.py): the peers' command line
and the measuring of each config with the peers' own helpers, one JSON line per config.

The caller puts $PEERS_DIR/peers on sys.path before importing this module.
"""
import argparse

import torch
from torch.utils.data import DataLoader, RandomSampler
from torchvision.transforms import v2

from common import DEFAULT_DATA, IMAGENET_MEAN, IMAGENET_STD, cores, emit, error, log, measure

SYSTEM = "pytorch-dataloader"


def arguments(doc, configs, default):
    """The peers' options (--data, --config, --batch, --workers, --warmup, --batches, --seed),
    parsed; `default` lists the configs run when none is given."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--config", action="append", choices=configs)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=cores())
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches")
    ap.add_argument("--batches", type=int, default=30, help="timed batches")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.config = a.config or default
    return a


def transform(steps, normalize):
    """`steps`, then the peers' ending: a float32 tensor scaled to [0, 1] and normalized with
    ImageNet's mean and std when `normalize`, else the uint8 tensor."""
    if normalize:
        steps = steps + [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    else:
        steps = steps + [v2.ToImage()]
    return v2.Compose(steps)


def folder_loader(ds, batch, workers, total_batches, seed):
    """The peers' DataLoader over a folder dataset: batches of `batch`, `workers` processes
    prefetching 2 batches each, sampling without replacement (re-permuted each pass) for
    `total_batches` batches; with the dataset's size for the JSON line."""
    kw = dict(batch_size=batch, num_workers=workers, drop_last=True, pin_memory=False, persistent_workers=False)
    if workers > 0:
        kw["prefetch_factor"] = 2
    g = torch.Generator().manual_seed(seed)
    sampler = RandomSampler(ds, replacement=False, num_samples=total_batches * batch, generator=g)
    return DataLoader(ds, sampler=sampler, **kw), {"dataset_size": len(ds)}


def run(a, pipeline_of, build_loader, versions):
    """Measures every config of `a` as the peers do (their `measure`, NCHW batches) and prints
    its line; a config that fails prints an error line and the others still run."""
    torch.manual_seed(a.seed)
    for cfg in a.config:
        pipeline = pipeline_of(cfg)
        try:
            loader, info = build_loader(cfg, a.data, a.batch, a.workers, a.warmup + a.batches + 1, a.seed)
            it = iter(loader)
            items, dt, first = measure(it, a.warmup, a.batches, lambda b: b[0].shape[0])
            del it
            emit(SYSTEM, pipeline, cfg, items, dt, a.batches, batch_size=a.batch, workers=a.workers,
                 warmup_batches=a.warmup, first_batch_s=round(first or 0, 3), layout="NCHW",
                 versions=versions, **info)
        except Exception as e:  # keep going with the other configs
            log(f"[{SYSTEM}/{cfg}] failed: {e!r}")
            error(SYSTEM, pipeline, cfg, e, versions=versions)

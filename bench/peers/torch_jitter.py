#!/usr/bin/env python3
"""PyTorch DataLoader peer of the `python.map` benchmark (bench/python_stage.sh).

The peers' DataLoader recipe (their peers/torch_loader.py: read JPEG bytes -> torchvision
decode_jpeg -> v2.RandomResizedCrop(224, antialias) -> v2.RandomHorizontalFlip -> [ToDtype(float32,
scale) + Normalize(ImageNet)], default collate into batches of 128, num_workers = cores, steady
state seen by the main process) with bench/python/colour_jitter.py's `jitter` inserted right after
the crop, the very function Granary's `python.map` stage calls: inside the DataLoader workers,
the cropped CHW uint8 tensor is copied to a C-contiguous HWC NumPy array, passed as
`{"image": ...}` with a `numpy.random.Generator` (one per worker, seeded from the worker's torch
seed), and the returned HWC array is copied back to a contiguous CHW tensor.

Configs (--config, repeatable; default: float32, uint8):
  float32           jitter + float32 CHW normalized (the peers' float32 + jitter)
  uint8             jitter + uint8 CHW (the peers' uint8 + jitter)
  float32-identity  colour_jitter.identity instead of jitter (the round trip alone)
  uint8-identity    the same, uint8

It imports the peers' own helpers (common.py, torch_loader.py) from $PEERS_DIR/peers (the peer
benchmarks' folder; required) and prints their JSON line format, with `pipeline` set to
image-rrc224-jitter-flip (image-rrc224-flip for the identity configs) as Granary's manifests.
"""
import os

# One thread per worker for NumPy's BLAS, as Granary's Python runners get (the colour jitter does
# two small matrix-vector products per image): with one thread per core in every worker process
# of a 2-core machine, more would only compete.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.environ.get("PEERS_DIR", "")
if not PEERS_DIR:
    sys.exit("set PEERS_DIR to the peer benchmarks' folder (it holds peers/torch_loader.py)")
sys.path.insert(0, os.path.join(PEERS_DIR, "peers"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import get_worker_info  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import colour_jitter  # noqa: E402
from common import load_labels  # noqa: E402
from loader_run import arguments, folder_loader, run, transform  # noqa: E402
from torch_loader import FolderDataset, decode_tv  # noqa: E402

class NumpyStage:
    """A v2 transform step that calls a `python.map`-style function (element dict in and out,
    optional `rng`) on the image as HWC NumPy: CHW tensor -> HWC view -> function -> CHW view."""

    def __init__(self, fn, takes_rng, **args):
        self.fn, self.takes_rng, self.args = fn, takes_rng, args
        self.rng = None

    def _generator(self):
        if self.rng is None:  # first call in this worker process
            # torch seeds each worker differently (its base seed + the worker's id)
            info = get_worker_info()
            self.rng = np.random.default_rng(info.seed if info is not None else torch.initial_seed())
        return self.rng

    def __call__(self, image):
        # Contiguous both ways: the function gets a C-contiguous HWC array, as Granary passes it,
        # and the rest of the recipe a contiguous CHW tensor, as without the stage. Of the four
        # ways (views or copies, in and out), this one was the fastest here.
        element = {"image": image.permute(1, 2, 0).contiguous().numpy()}
        if self.takes_rng:
            out = self.fn(element, rng=self._generator(), **self.args)
        else:
            out = self.fn(element, **self.args)
        return torch.from_numpy(out["image"]).permute(2, 0, 1).contiguous()


def build_loader(cfg, data, batch, workers, total_batches, seed):
    dtype, _, variant = cfg.partition("-")
    if variant == "identity":
        stage = NumpyStage(colour_jitter.identity, takes_rng=False)
    else:
        stage = NumpyStage(colour_jitter.jitter, takes_rng=True, brightness=0.4, contrast=0.4, saturation=0.4)
    steps = transform([v2.RandomResizedCrop(224, antialias=True), stage, v2.RandomHorizontalFlip()], dtype != "uint8")
    ds = FolderDataset(load_labels(data), decode_tv, steps)
    return folder_loader(ds, batch, workers, total_batches, seed)


def main():
    a = arguments(__doc__, ["float32", "uint8", "float32-identity", "uint8-identity"], ["float32", "uint8"])
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__, "numpy": np.__version__}
    run(a, lambda cfg: "image-rrc224-flip" if cfg.endswith("-identity") else "image-rrc224-jitter-flip",
        build_loader, versions)


if __name__ == "__main__":
    main()

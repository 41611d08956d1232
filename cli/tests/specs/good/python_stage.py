"""Python stages of the good spec python-map.yaml, imported by `granary validate`."""

import numpy as np


def brighten(element, rng, factor=1.1):
    image = element["image"].astype(np.float32) * factor * rng.uniform(0.9, 1.1)
    return {**element, "image": np.clip(image, 0, 255).astype(np.uint8)}


def brighten_all(batch):
    return {**batch, "image": np.clip(batch["image"].astype(np.float32) * 1.1, 0, 255).astype(np.uint8)}


def bright_enough(element, threshold=40):
    """A `python.filter` of filters.yaml: keeps images whose mean is at least `threshold`."""
    return element["image"].mean() >= threshold

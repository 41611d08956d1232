"""Colour jitter for Granary's `python.map` stage (function `augment:jitter`).

Granary calls `jitter(element, rng, **args)` once per element. `element["image"]` is a decoded
image, height x width x 3 `uint8`; `rng` is a `numpy.random.Generator` seeded from the pipeline's
seed, the epoch, the split and the element, so a recomputed split gives the same images. The
function returns the element's new fields: here the same fields, the image jittered.

Shipped to the workers in a ConfigMap (augment-configmap.yaml holds a copy of this file; see
README.md); it needs nothing but NumPy, which Granary's Python image has.
"""

import numpy as np

# ITU-R BT.601 luma weights: the grey an RGB pixel would be.
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def jitter(element, rng, brightness=0.4, contrast=0.4, saturation=0.4):
    """Random brightness, contrast and saturation, each a factor drawn from
    [1 - strength, 1 + strength] and applied in a random order, as torchvision's ColorJitter."""
    image = element["image"].astype(np.float32)
    for step in rng.permutation(3):
        if step == 0 and brightness > 0:
            image *= rng.uniform(1 - brightness, 1 + brightness)
        elif step == 1 and contrast > 0:
            mean = float((image @ LUMA).mean())
            image = (image - mean) * rng.uniform(1 - contrast, 1 + contrast) + mean
        elif step == 2 and saturation > 0:
            grey = (image @ LUMA)[..., np.newaxis]
            image = (image - grey) * rng.uniform(1 - saturation, 1 + saturation) + grey
    out = dict(element)
    out["image"] = np.clip(image, 0, 255).astype(np.uint8)
    return out

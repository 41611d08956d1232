"""Element-wise augmentations: `fn(element, rng, **args)` returns the element's new fields."""

import numpy as np

LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def random_grayscale(element, rng, p=0.1):
    """With probability `p`, the image in grey (kept 3 channels, as torchvision's RandomGrayscale)."""
    if rng.random() >= p:
        return element
    image = element["image"]
    grey = np.rint(image.astype(np.float32) @ LUMA).astype(np.uint8)
    out = dict(element)
    out["image"] = np.repeat(grey[..., np.newaxis], 3, axis=-1)
    return out

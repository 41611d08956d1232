"""The colour jitter of the `python.map` benchmark (bench/python_stage.sh), as one NumPy function
that both systems call: Granary as a `python.map` stage (`colour_jitter:jitter`, one element dict
in and out, `rng` given by Granary) and the PyTorch DataLoader peer (bench/peers/torch_jitter.py)
on the HWC array of each cropped image, inside its workers.

`jitter` is torchvision's ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4) in a fixed
order (brightness, contrast, saturation; no hue), on a height × width × 3 uint8 image: each factor
is drawn uniformly from [1 - s, 1 + s] with `rng`, the image is blended as torchvision does
(brightness with black, contrast with the mean of the grey image, saturation with the grey
image), clamped to [0, 255] after each step, and truncated back to uint8. The arithmetic is
float32, in place in one working copy (about 0.4 ms for a 224 × 224 image on one core here).

The other functions are the benchmark's controls: `identity` (what crossing into Python and back
costs) and `burn` (a fixed amount of pure-Python work per element, for the 1 → 2 core scaling).
"""

import numpy as np

# ITU-R 601-2 luma, as torchvision's rgb_to_grayscale.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def jitter_image(image, rng, brightness=0.4, contrast=0.4, saturation=0.4):
    """The jittered copy of `image` (H × W × 3 uint8, any strides) as a new H × W × 3 uint8 array."""
    b, c, s = rng.uniform(
        (1.0 - brightness, 1.0 - contrast, 1.0 - saturation),
        (1.0 + brightness, 1.0 + contrast, 1.0 + saturation),
    )
    f32 = np.float32
    # The one working copy, C-contiguous whatever the input's strides (a CHW tensor's HWC view
    # included), so that `flat` is a view of it.
    x = image.astype(f32, order="C")
    flat = x.reshape(-1, 3)
    # Brightness: blend with black.
    x *= f32(b)
    np.clip(x, 0.0, 255.0, out=x)
    # Contrast: blend with the mean of the grey image.
    grey = flat @ _LUMA
    mean = grey.sum() / grey.size
    x *= f32(c)
    x += f32((1.0 - c) * mean)
    np.clip(x, 0.0, 255.0, out=x)
    # Saturation: blend with the grey image, one channel at a time (a broadcast over the last
    # axis of length 3 is several times slower).
    np.matmul(flat, _LUMA, out=grey)
    grey *= f32(1.0 - s)
    x *= f32(s)
    for k in range(3):
        channel = flat[:, k]
        channel += grey
    np.clip(x, 0.0, 255.0, out=x)
    return x.astype(np.uint8)


def jitter(element, rng, brightness=0.4, contrast=0.4, saturation=0.4):
    """`python.map` stage: the element with its `image` field jittered (other fields unchanged)."""
    out = dict(element)
    out["image"] = jitter_image(element["image"], rng, brightness, contrast, saturation)
    return out


def identity(element):
    """`python.map` stage that returns its input: the cost of the crossing alone."""
    return element


def burn(element, iterations=100_000):
    """`python.map` stage that does `iterations` steps of pure-Python arithmetic (a few ms, no
    I/O, holding the GIL) and passes the element on unchanged: CPU work that only separate
    interpreter processes can spread over cores."""
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    out = dict(element)
    out["burn"] = np.int64(acc)
    return out

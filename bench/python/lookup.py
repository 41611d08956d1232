"""A Python stage that waits, as a feature lookup over the network would (bench/optimizer.sh's
`python-lookup` pipeline): the element comes back with a `feature` field after `seconds`."""

import time

import numpy as np


def fetch(element, key, seconds=0.002):
    time.sleep(seconds)
    out = dict(element)
    out["feature"] = np.frombuffer(key.encode()[:8].ljust(8, b"\0"), dtype=np.uint8).copy()
    return out

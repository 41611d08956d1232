"""Augmentations for Granary's `python.map` stages, installed into a worker image (see
../Dockerfile): a stage names them as `team_augment.ops:random_grayscale`."""

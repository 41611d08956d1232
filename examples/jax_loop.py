"""Train a small classifier with JAX on batches that Granary serves, on CPU.

    cargo run --release -p granary-cli -- demo --no-run
    cargo run --release -p granary-cli -- run examples/imagenet-resnet50-uint8.yaml \\
        --serve 127.0.0.1:7070 --workers 2 &
    python examples/jax_loop.py --dispatcher 127.0.0.1:7070 --pipeline imagenet-resnet50-uint8

Each epoch is one pass of `pipeline.epoch()`; the arrays go to JAX with `jnp.asarray`, which
does not copy on CPU. With `--checkpoint FILE` the loop saves the parameters and the pipeline's
position every `--checkpoint-every` steps and, when FILE exists, resumes from it, mid-epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import granary


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatcher", default=os.environ.get("GRANARY_DISPATCHER"), help="host:port")
    parser.add_argument("--pipeline", default="imagenet-resnet50-uint8")
    parser.add_argument("--job", default=None, help="default: the pipeline's name")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the whole job)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--checkpoint", default=None, help=".npz file to save to and resume from")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    return parser.parse_args()


def features(images: jax.Array) -> jax.Array:
    """Pixels scaled to [0, 1] (uint8 input) and flattened, whatever the layout."""
    x = images.astype(jnp.float32)
    if images.dtype == jnp.uint8:
        x = x / 255.0
    return x.reshape(x.shape[0], -1)


def init(key: jax.Array, inputs: int, hidden: int, classes: int) -> dict[str, jax.Array]:
    first, second = jax.random.split(key)
    return {
        "w1": jax.random.normal(first, (inputs, hidden)) * (2.0 / inputs) ** 0.5,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(second, (hidden, classes)) * (1.0 / hidden) ** 0.5,
        "b2": jnp.zeros(classes),
    }


def loss_fn(params: dict[str, jax.Array], images: jax.Array, labels: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(features(images) @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def main() -> None:
    args = arguments()
    pipeline = granary.Pipeline(args.pipeline, args.dispatcher, job=args.job)
    params = None
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        with np.load(args.checkpoint) as saved:
            pipeline.load_state_dict(json.loads(saved["pipeline"].item()))
            params = {name[len("param_") :]: jnp.asarray(saved[name]) for name in saved.files if name.startswith("param_")}
            step = int(saved["step"])
        print(f"resumed at step {step}")

    @jax.jit
    def train_step(params, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        return jax.tree.map(lambda p, g: p - args.learning_rate * g, params, grads), loss

    def save() -> None:
        # The parameters and the pipeline's position, together: resuming restores both.
        temporary = args.checkpoint + ".tmp.npz"
        arrays = {f"param_{name}": np.asarray(value) for name, value in params.items()}
        np.savez(temporary, pipeline=json.dumps(pipeline.state_dict()), step=step, **arrays)
        os.replace(temporary, args.checkpoint)

    epochs = pipeline.client.epochs
    print(f"{args.pipeline}: {epochs} epochs, batches of {pipeline.client.batch_size}, {jax.devices()[0]}")
    while args.steps == 0 or step < args.steps:
        started, images_seen, loss, epoch = time.perf_counter(), 0, None, None
        for batch in pipeline.epoch():
            if batch.rows == 0:
                continue  # the last round of an epoch may hold an empty batch
            images = jnp.asarray(batch["image"])
            labels = jnp.asarray(batch["label"]).astype(jnp.int32) % args.classes
            if params is None:
                params = init(jax.random.key(0), features(images).shape[1], args.hidden, args.classes)
            params, loss = train_step(params, images, labels)
            step += 1
            images_seen += batch.rows
            epoch = batch.epoch
            if args.checkpoint and step % args.checkpoint_every == 0:
                save()
            if args.steps and step >= args.steps:
                break
        if epoch is None:
            break  # no epochs left in the job
        jax.block_until_ready(params)  # JAX dispatches asynchronously: time the finished work
        seconds = time.perf_counter() - started
        print(f"epoch {epoch}: step {step}, loss {float(loss):.4f}, {images_seen / seconds:.1f} images/s")
    if args.checkpoint and params is not None:
        save()
    pipeline.close()
    print(f"done after {step} steps")


if __name__ == "__main__":
    main()

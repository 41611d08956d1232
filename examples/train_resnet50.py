"""Train ResNet-50 with PyTorch on batches that Granary serves (CPU or GPU).

    cargo run --release -p granary-cli -- demo --no-run
    cargo run --release -p granary-cli -- run examples/imagenet-resnet50-uint8.yaml \\
        --serve 127.0.0.1:7070 --workers 2 &
    python examples/train_resnet50.py --dispatcher 127.0.0.1:7070 --steps 20

The DataLoader takes Granary's batches as they are (`batch_size=None`), so the input pipeline
runs on Granary's workers, and the client reports the loop's step and wait times to the
autoscaler. Launched with torchrun, each rank joins as one consumer of the job: each element
reaches one rank per epoch and every rank gets as many batches. With `--checkpoint FILE` the
model, the optimizer and the pipeline's position are saved every `--checkpoint-every` steps, and
a run whose FILE exists resumes from it, mid-epoch.

uint8 HWC images (examples/imagenet-resnet50-uint8.yaml) are normalized on the device, as DALI
and FFCV users do; float32 CHW batches (examples/imagenet-resnet50.yaml) are used as they come.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed
import torchvision
from torch.utils.data import DataLoader

from granary.torch import IterableDataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatcher", default=os.environ.get("GRANARY_DISPATCHER"), help="host:port")
    parser.add_argument("--pipeline", default="imagenet-resnet50-uint8")
    parser.add_argument("--job", default=None, help="default: the pipeline's name")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the whole job)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--checkpoint", default=None, help="file to save to and resume from")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args()


def to_model_input(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """NCHW float32 on the device: uint8 NHWC is moved as uint8 (a quarter of the bytes), then
    laid out and normalized there."""
    images = images.to(device, non_blocking=True)
    if images.dtype == torch.uint8:
        images = images.permute(0, 3, 1, 2).float()
        return (images - MEAN.to(device)) / STD.to(device)
    return images


def main() -> None:
    args = arguments()
    device = torch.device(args.device)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = torch.distributed.get_rank() if distributed else 0

    dataset = IterableDataset(args.pipeline, args.dispatcher, job=args.job)
    loader = DataLoader(dataset, batch_size=None, pin_memory=device.type == "cuda")
    model = torchvision.models.resnet50(num_classes=1000).to(device)  # no weights download
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()

    step = 0
    checkpoint = args.checkpoint and (f"{args.checkpoint}.rank{rank}" if distributed else args.checkpoint)
    if checkpoint and os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        dataset.load_state_dict(saved["data"])
        step = saved["step"]
        print(f"[rank {rank}] resumed at step {step}")

    def save() -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "data": dataset.state_dict(),  # the pipeline's position: resumes mid-epoch
            "step": step,
        }
        torch.save(state, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)

    client = dataset.pipeline.client
    print(
        f"[rank {rank}] {args.pipeline}: consumer {client.consumer_index} of {client.num_consumers}, "
        f"{client.epochs} epochs, batches of {client.batch_size}, on {device}"
    )
    model.train()
    done = False
    while not done:
        started, images_seen, epoch, loss = time.perf_counter(), 0, None, None
        for batch in loader:
            images = to_model_input(batch["image"], device)
            labels = batch["label"].to(device, non_blocking=True).long() % 1000
            loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            images_seen += len(labels)
            epoch = client.epoch
            print(f"[rank {rank}] step {step}: loss {loss.item():.4f}")
            if checkpoint and step % args.checkpoint_every == 0:
                save()
            if args.steps and step >= args.steps:
                done = True
                break
        if epoch is None:
            break  # the job has no more epochs
        seconds = time.perf_counter() - started
        print(f"[rank {rank}] epoch {epoch}: {images_seen / seconds:.1f} images/s")
    if checkpoint:
        save()
    dataset.pipeline.close()
    if distributed:
        torch.distributed.destroy_process_group()
    print(f"[rank {rank}] done after {step} steps")


if __name__ == "__main__":
    main()

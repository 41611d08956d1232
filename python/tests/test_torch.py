"""granary.torch with a real DataLoader; skipped, saying so, where torch is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch tests are skipped")

from torch.utils.data import DataLoader  # noqa: E402

from conftest import EPOCHS, IMAGES  # noqa: E402
from granary.testing import free_port  # noqa: E402
from granary.torch import IterableDataset, to_tensors  # noqa: E402

HERE = Path(__file__).resolve().parent


def test_each_pass_over_the_loader_is_one_epoch_of_tensors(service):
    dataset = IterableDataset(service.pipeline, service.dispatcher, job="torch-epochs", keys=True)
    loader = DataLoader(dataset, batch_size=None)
    passes = []
    for _ in range(EPOCHS):
        keys = []
        for batch in loader:
            assert isinstance(batch["image"], torch.Tensor) and batch["image"].dtype == torch.uint8
            assert batch["image"].shape[1:] == (32, 32, 3)
            assert batch["label"].shape == (len(batch["__key__"]),)
            keys += batch["__key__"]
        passes.append(keys)
    assert [len(keys) for keys in passes] == [IMAGES] * EPOCHS
    assert all(len(set(keys)) == IMAGES for keys in passes)
    assert list(loader) == [], "the job has no more epochs"


def test_tensors_share_the_received_memory(service):
    dataset = IterableDataset(service.pipeline, service.dispatcher, job="torch-zero-copy")
    batch = next(dataset.pipeline)
    tensors = to_tensors(batch)
    for name, array in batch.items():
        assert tensors[name].data_ptr() == array.ctypes.data, name


def test_state_dict_resumes_mid_epoch(service):
    first = IterableDataset(service.pipeline, service.dispatcher, job="torch-resume", keys=True)
    seen = []
    for index, batch in enumerate(DataLoader(first, batch_size=None)):
        seen += batch["__key__"]
        if index == 1:
            break
    state = first.state_dict()
    first.pipeline.close()
    second = IterableDataset(service.pipeline, service.dispatcher, job="torch-resume", keys=True)
    second.load_state_dict(state)
    for batch in DataLoader(second, batch_size=None):
        seen += batch["__key__"]
    assert len(seen) == IMAGES and len(set(seen)) == IMAGES


def test_each_distributed_rank_is_a_consumer_with_as_many_batches(service):
    environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    ranks = [
        subprocess.Popen(
            [sys.executable, str(HERE / "torch_rank.py"), service.dispatcher, service.pipeline, "torch-ddp"],
            env=dict(environment, RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    reports = []
    for process in ranks:
        stdout, stderr = process.communicate(timeout=180)
        assert process.returncode == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    assert [report["consumer"] for report in reports] == [[0, 2], [1, 2]]
    assert reports[0]["batches"] == reports[1]["batches"], "every rank gets the same number of batches"
    keys = reports[0]["keys"] + reports[1]["keys"]
    assert len(keys) == IMAGES and len(set(keys)) == IMAGES, "each element reaches exactly one rank"
    assert not set(reports[0]["keys"]) & set(reports[1]["keys"])

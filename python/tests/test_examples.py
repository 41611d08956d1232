"""The examples run as a user would run them, against the local service. The JAX example runs
wherever JAX is installed (CI installs it); the PyTorch one where torch and torchvision are."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def require(*modules: str) -> None:
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: this example is not run")


def test_jax_example_trains_checkpoints_and_resumes(service, tmp_path, run_python):
    require("jax")
    script = EXAMPLES / "jax_loop.py"
    common = ["--dispatcher", service.dispatcher, "--pipeline", service.pipeline, "--job", "example-jax"]
    common += ["--classes", "10", "--hidden", "16", "--checkpoint", str(tmp_path / "jax.npz")]
    first = run_python(script, *common, "--steps", "4", "--checkpoint-every", "2")
    assert "done after 4 steps" in first, first
    second = run_python(script, *common, "--steps", "9")
    assert "resumed at step 4" in second and "done after 9 steps" in second, second
    assert "loss" in second


def test_pytorch_example_trains_resnet50(service, tmp_path, run_python):
    require("torch", "torchvision")
    script = EXAMPLES / "train_resnet50.py"
    output = run_python(
        script,
        *["--dispatcher", service.dispatcher, "--pipeline", service.pipeline, "--job", "example-torch"],
        *["--steps", "2", "--checkpoint", str(tmp_path / "resnet.pt")],
        timeout=600,
    )
    assert "step 2: loss" in output and "done after 2 steps" in output, output
    assert (tmp_path / "resnet.pt").exists()


def test_kubernetes_trainer_reads_one_epoch(service, run_python):
    require("torch")
    script = EXAMPLES / "kubernetes" / "trainer.py"
    output = run_python(
        script, "--dispatcher", service.dispatcher, "--pipeline", service.pipeline, "--job", "example-k8s"
    )
    assert output.startswith("epoch done: ") and " batches, " in output, output

"""The Python client against a real local service: exactly-once epochs, the Rust client's values,
zero-copy arrays, resuming in a new process, trainer metrics and errors."""

from __future__ import annotations

import collections
import json
import re
import time
import tracemalloc
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import granary
from granary import _native
from granary.testing import element_digests
from conftest import BATCH, EPOCHS, IMAGES, start_service, wait_for

HERE = Path(__file__).resolve().parent


def reference(service, job: str) -> _native.DrainReport:
    """What the Rust client receives for a job, without Python in the loop."""
    client = _native.Client(service.pipeline, service.dispatcher, job=job)
    try:
        return client.drain(digests=True)
    finally:
        client.close()


def assert_exactly_once(received: list[tuple[int, str]]) -> None:
    per_epoch = collections.defaultdict(list)
    for epoch, key in received:
        per_epoch[epoch].append(key)
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, keys in per_epoch.items():
        duplicated = [key for key, count in collections.Counter(keys).items() if count > 1]
        assert not duplicated, f"epoch {epoch}: delivered twice: {duplicated}"
        assert len(keys) == IMAGES, f"epoch {epoch}: {len(keys)} of {IMAGES} elements"


def test_every_epoch_arrives_once_with_the_values_the_rust_client_receives(service):
    rust = reference(service, "reference")
    assert rust.rows == IMAGES * EPOCHS
    batches = []
    with granary.Pipeline(service.pipeline, service.dispatcher, job="python") as pipeline:
        assert (pipeline.client.epochs, pipeline.client.batch_size) == (EPOCHS, BATCH)
        for batch in pipeline:
            assert set(batch) == {"image", "label"}
            assert batch["image"].dtype == np.uint8
            assert batch["image"].shape == (batch.rows, 32, 32, 3)
            assert batch["label"].shape == (batch.rows,)
            batches.append(batch)
    assert_exactly_once([(batch.epoch, key) for batch in batches for key in batch.element_keys])
    digests = element_digests(batches)
    assert len(digests) == IMAGES * EPOCHS
    assert digests == rust.digests, "the Python arrays differ from what the Rust client received"
    assert sum(batch.rows for batch in batches) == rust.rows
    assert sum(array.nbytes for batch in batches for array in batch.values()) == rust.bytes


def test_epoch_iterates_one_epoch_at_a_time(service):
    with granary.Pipeline(service.pipeline, service.dispatcher, job="per-epoch") as pipeline:
        epochs = [[(batch.epoch, batch.rows) for batch in pipeline.epoch()] for _ in range(EPOCHS + 1)]
    assert [{epoch for epoch, _ in batches} for batches in epochs] == [{0}, {1}, set()]
    assert [sum(rows for _, rows in batches) for batches in epochs] == [IMAGES] * EPOCHS + [0]


def base_object(array: np.ndarray) -> object:
    """The object at the end of an array's `base` chain (through a memoryview, if any)."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_arrays_are_read_only_views_of_the_received_buffers(service):
    with granary.Pipeline(service.pipeline, service.dispatcher, job="zero-copy") as pipeline:
        raw = pipeline.client.next()
        batch = granary.Batch(raw)
        received = {name: buffer.address for name, _, _, buffer in raw.tensors()}
        for name, array in batch.items():
            assert not array.flags.owndata and not array.flags.writeable
            owner = base_object(array)
            assert isinstance(owner, _native.TensorBuffer), type(owner)
            assert array.ctypes.data == owner.address == received[name], name
            assert array.nbytes == owner.nbytes
        with pytest.raises(ValueError, match="read-only"):
            batch["image"][0, 0, 0, 0] = 1

        # Iterating allocates no tensor memory per batch: NumPy reports every data allocation
        # to tracemalloc, and a copy would allocate a whole image tensor.
        image_bytes = BATCH * 32 * 32 * 3
        tracemalloc.start()
        try:
            for _ in range(IMAGES // BATCH - 1):
                batch = next(pipeline)
                assert batch["image"].nbytes == image_bytes
                del batch
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < image_bytes / 2, f"{peak} bytes allocated while iterating"


def test_resumes_mid_epoch_in_a_new_process(service, tmp_path, run_python):
    script = HERE / "resume_step.py"
    first = json.loads(run_python(script, service.dispatcher, service.pipeline, "resume", "-", "batches:3"))
    assert len(first["received"]) == 3 * BATCH
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first["state"]))
    second = json.loads(run_python(script, service.dispatcher, service.pipeline, "resume", str(state), "rest"))
    assert_exactly_once([tuple(item) for item in first["received"] + second["received"]])


def test_resumes_at_an_epoch_boundary(service, tmp_path, run_python):
    # Pipeline.epoch() stops after the epoch's last batch: the state is "epoch 0 complete", and
    # the next process gets all of epoch 1.
    script = HERE / "resume_step.py"
    first = json.loads(run_python(script, service.dispatcher, service.pipeline, "boundary", "-", "epochs:1"))
    assert {epoch for epoch, _ in first["received"]} == {0}
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first["state"]))
    second = json.loads(run_python(script, service.dispatcher, service.pipeline, "boundary", str(state), "rest"))
    assert {epoch for epoch, _ in second["received"]} == {1}
    assert_exactly_once([tuple(item) for item in first["received"] + second["received"]])


def test_state_dict_round_trips_in_process(service):
    pipeline = granary.Pipeline(service.pipeline, service.dispatcher, job="in-process")
    assert pipeline.state_dict()["position"] is None
    seen = [key for _ in range(2) for key in next(pipeline).element_keys]
    state = pipeline.state_dict()
    json.dumps(state)  # plain JSON types: fits any checkpoint format
    pipeline.load_state_dict(state)
    seen += [key for batch in pipeline.epoch() for key in batch.element_keys]
    pipeline.close()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == IMAGES


def test_trainer_step_and_wait_times_reach_the_dispatcher(service):
    def step_histogram(steps: int) -> tuple[float, float] | None:
        with urllib.request.urlopen(f"http://{service.metrics}/metrics", timeout=5) as response:
            text = response.read().decode()
        figures = {}
        for line in text.splitlines():
            if line.startswith("granary_trainer_step_seconds_") and 'trainer_job="metrics"' in line:
                name = re.match(r"granary_trainer_step_seconds_(\w+)", line).group(1)
                figures[name] = float(line.rsplit(" ", 1)[1])
        if figures.get("count", 0) < steps:
            return None
        return figures["count"], figures["sum"]

    steps = 0
    with granary.Pipeline(service.pipeline, service.dispatcher, job="metrics") as pipeline:
        for _batch in pipeline.epoch():
            time.sleep(0.03)  # the "training step"
            steps += 1
        # The client reports with its heartbeats (every 500 ms) while it is open. Every step but
        # the first (which has no step before it) is measured, from the iteration alone.
        assert wait_for(lambda: step_histogram(steps - 1) is not None, timeout=15), "no step times"
    count, total = step_histogram(steps - 1)
    assert total / count >= 0.025, f"mean step {total / count:.4f} s: the sleeps were 30 ms"


def image_share(service, job: str) -> float | None:
    """The dispatcher's share of `job`'s images its trainers' hosts make."""
    with urllib.request.urlopen(f"http://{service.metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("granary_dispatcher_job_image_share{") and f'trainer_job="{job}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.parametrize("images", ["client", "workers"])
def test_images_made_on_this_host_or_on_the_workers_are_the_same_bytes(service, images):
    rust = reference(service, f"reference-{images}")
    job = f"images-{images}"
    share = 1.0 if images == "client" else 0.0
    with granary.Pipeline(service.pipeline, service.dispatcher, job=job, images=images) as pipeline:
        assert pipeline.images == images
        batches = [next(pipeline)]
        # While the job reads, the dispatcher has its trainer make all the images or none.
        assert wait_for(lambda: image_share(service, job) == share, timeout=10), image_share(service, job)
        batches += list(pipeline)
    assert_exactly_once([(batch.epoch, key) for batch in batches for key in batch.element_keys])
    assert element_digests(batches) == rust.digests, f"images={images!r} changed the pixels"


def test_an_unknown_pipeline_raises_pipeline_not_found(service):
    pipeline = granary.Pipeline("no-such-pipeline", service.dispatcher)
    with pytest.raises(granary.PipelineNotFound, match="no-such-pipeline") as raised:
        next(pipeline)
    assert isinstance(raised.value, LookupError) and raised.value.code == "NotFound"


def test_a_dead_dispatcher_raises_dispatcher_unavailable(binary, demo_data, tmp_path):
    from conftest import MANIFEST

    manifest = tmp_path / "pipeline.yaml"
    manifest.write_text(MANIFEST.format(data=demo_data, batch=BATCH, epochs=1))
    service = start_service(binary, manifest, tmp_path / "granary.log", workers=1)
    service.stop()
    pipeline = granary.Pipeline(service.pipeline, service.dispatcher)
    with pytest.raises(granary.DispatcherUnavailable, match=re.escape(service.dispatcher)) as raised:
        next(pipeline)
    assert isinstance(raised.value, ConnectionError)


def test_without_a_dispatcher_address_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("GRANARY_DISPATCHER", raising=False)
    with pytest.raises(granary.ConfigurationError, match="GRANARY_DISPATCHER"):
        next(granary.Pipeline("anything"))


def test_the_prefetch_budget_reaches_the_client(service):
    with granary.Pipeline(service.pipeline, service.dispatcher, job="prefetch", prefetch_bytes=0) as pipeline:
        assert next(pipeline).rows == BATCH
        # No budget: the client holds the 4 batches it starts with, whatever the trainer does.
        assert pipeline.client.prefetch_batches == 4


def test_the_dispatcher_address_comes_from_the_environment(service, monkeypatch):
    monkeypatch.setenv("GRANARY_DISPATCHER", service.dispatcher)
    with granary.Pipeline(service.pipeline, job="from-env") as pipeline:
        assert next(pipeline).rows == BATCH


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "x", "mode": "broadcast"}, "mode"),
        ({"name": "x", "num_consumers": 0}, "num_consumers"),
        ({"name": "x", "num_consumers": 2, "consumer_index": 2}, "consumer_index"),
        ({"name": "x", "images": "gpu"}, "images"),
        ({"name": "x", "prefetch_bytes": -1}, "prefetch_bytes"),
        ({"name": "x", "prefetch_bytes": "1G"}, "prefetch_bytes"),
    ],
)
def test_bad_arguments_name_the_field(arguments, field):
    with pytest.raises(granary.ConfigurationError, match=f"^{field}:"):
        granary.Pipeline(**arguments)


def test_bad_states_raise_invalid_position(service):
    pipeline = granary.Pipeline(service.pipeline, service.dispatcher, job="bad-state")
    with pytest.raises(granary.InvalidPosition, match=r"state_dict\['pipeline'\]"):
        pipeline.load_state_dict({"version": 1, "pipeline": "other", "position": None})
    with pytest.raises(granary.InvalidPosition, match="version"):
        pipeline.load_state_dict({"pipeline": service.pipeline})
    pipeline.load_state_dict({"version": 1, "pipeline": service.pipeline, "position": "garbage"})
    with pytest.raises(granary.InvalidPosition, match="not a Granary position"):
        next(pipeline)

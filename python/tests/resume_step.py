"""One training process of the resume tests: optionally loads a state, reads some batches, and
prints what it received and the state to resume from, as JSON.

usage: resume_step.py DISPATCHER PIPELINE JOB STATE_FILE|- HOW
HOW: `batches:N` reads N batches; `epochs:N` iterates N whole epochs with Pipeline.epoch();
`rest` reads to the end of the job.
"""

from __future__ import annotations

import json
import sys

import granary


def main() -> None:
    dispatcher, pipeline_name, job, state_file, how = sys.argv[1:6]
    pipeline = granary.Pipeline(pipeline_name, dispatcher, job=job)
    if state_file != "-":
        with open(state_file) as file:
            pipeline.load_state_dict(json.load(file))
    received: list[tuple[int, str]] = []
    kind, _, count = how.partition(":")
    if kind == "batches":
        for _ in range(int(count)):
            batch = next(pipeline)
            received += [(batch.epoch, key) for key in batch.element_keys]
    elif kind == "epochs":
        for _ in range(int(count)):
            for batch in pipeline.epoch():
                received += [(batch.epoch, key) for key in batch.element_keys]
    elif kind == "rest":
        for batch in pipeline:
            received += [(batch.epoch, key) for key in batch.element_keys]
    else:
        raise SystemExit(f"unknown HOW {how!r}")
    state = pipeline.state_dict()
    # No close(): a training process that dies is the case to resume from.
    print(json.dumps({"received": received, "state": state}))


if __name__ == "__main__":
    main()

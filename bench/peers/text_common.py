"""What the text peers share: where bench/gen_text.py keeps the corpus, and the cores to use."""

import os

DEFAULT_DATA = os.environ.get("TEXT_BENCH_DATA") or os.path.expanduser("~/.cache/granary-text-bench")


def cores():
    """CPUs this process may run on (one DataLoader worker or map process per core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def corpus_files(data):
    """The corpus shards bench/gen_text.py wrote under `data`, sorted; exits saying how to make them."""
    import glob
    import sys

    files = sorted(glob.glob(os.path.join(data, "corpus", "*.jsonl")))
    if not files:
        sys.exit(f"no corpus under {data}: run bench/gen_text.py")
    return files

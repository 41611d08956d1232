#!/usr/bin/env python3
"""Hugging Face `datasets` peer of the LLM packing benchmark (bench/text.sh).

The recipe of `transformers`' run_clm.py, with the byte-level BPE tokenizer of bench/gen_text.py:

  1. `datasets.load_dataset("json", data_files=<the corpus' shards>, split="train")`;
  2. `.map(tokenize, batched=True, num_proc=cores, remove_columns=["id", "text"])`, where
     `tokenize` calls `Tokenizer.encode_batch` (Rust, the `tokenizers` package) on the batch's
     texts and appends `<|endoftext|>` to each document's ids;
  3. `.map(group_texts, batched=True, num_proc=cores)`: run_clm.py's group_texts, which
     concatenates a batch of documents and cuts it into blocks of 2048 tokens, dropping the
     remainder of each map batch (1000 documents) so that every block is full (it makes no
     `labels` copy: the trainer can shift `input_ids` itself);
  4. `.with_format("torch")` and a DataLoader over it with batches of `--batch` rows (default 8),
     iterated to the end: what the training loop receives, int64 [8, 2048].

Timed: what a user waits for to get one epoch of packed batches, from the call to load_dataset
(the JSON to Arrow conversion included) until the last batch is in hand, steps 1 to 4. Caching is
off (`datasets.disable_caching()`, and a fresh temporary cache folder for this run), so every
step does its work, as the first epoch of a new corpus or tokenizer does. Not timed: importing
the libraries and loading the tokenizer. `tokens_per_s` is 2048 × the rows delivered over that
time, and `items_per_s` rows/s; the line also gives the time of each step. `num_proc` processes
run the maps (one per core); the tokenizer's own Rayon pool is left as the library sets it up (on,
since the main process does not encode before the map forks), as in the DataLoader peer;
`--no-tokenizers-parallelism` turns it off to compare.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

from text_common import DEFAULT_DATA, corpus_files, cores

SYSTEM = "hf-datasets"
PIPELINE = "text-bpe-pack2048"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA, help="bench/gen_text.py's folder")
    ap.add_argument("--length", type=int, default=2048, help="block size")
    ap.add_argument("--batch", type=int, default=8, help="rows per batch")
    ap.add_argument("--num-proc", type=int, default=cores())
    ap.add_argument("--config", default="datasets-map")
    ap.add_argument("--no-tokenizers-parallelism", action="store_true")
    a = ap.parse_args()
    if a.no_tokenizers_parallelism:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    import datasets
    import tokenizers
    import torch
    from tokenizers import Tokenizer
    from torch.utils.data import DataLoader

    files = corpus_files(a.data)
    tok = Tokenizer.from_file(os.path.join(a.data, "bpe.json"))
    eos = tok.token_to_id("<|endoftext|>")
    block = a.length
    datasets.disable_caching()
    datasets.utils.logging.disable_progress_bar()

    def tokenize(batch):
        return {"input_ids": [e.ids + [eos] for e in tok.encode_batch(batch["text"])]}

    def group_texts(examples):
        # run_clm.py's group_texts, for the one column
        concatenated = [t for ids in examples["input_ids"] for t in ids]
        total = (len(concatenated) // block) * block
        return {"input_ids": [concatenated[i : i + block] for i in range(0, total, block)]}

    cache = tempfile.mkdtemp(prefix="granary-text-bench-hf-")
    try:
        t0 = time.perf_counter()
        ds = datasets.load_dataset("json", data_files=files, split="train", cache_dir=cache)
        t1 = time.perf_counter()
        ds = ds.map(tokenize, batched=True, num_proc=a.num_proc, remove_columns=ds.column_names)
        t2 = time.perf_counter()
        ds = ds.map(group_texts, batched=True, num_proc=a.num_proc)
        t3 = time.perf_counter()
        rows = 0
        for b in DataLoader(ds.with_format("torch"), batch_size=a.batch):
            rows += b["input_ids"].shape[0]
        t4 = time.perf_counter()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    dt = t4 - t0
    rec = {
        "system": SYSTEM,
        "pipeline": PIPELINE,
        "config": a.config,
        "items_per_s": round(rows / dt, 2),
        "cores": cores(),
        "batches": -(-rows // a.batch),
        "items": rows,
        "seconds": round(dt, 3),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "batch_size": a.batch,
        "num_proc": a.num_proc,
        "tokenizers_parallelism": not a.no_tokenizers_parallelism,
        "tokens": rows * block,
        "tokens_per_s": round(rows * block / dt, 1),
        "load_s": round(t1 - t0, 3),
        "tokenize_s": round(t2 - t1, 3),
        "group_s": round(t3 - t2, 3),
        "iterate_s": round(t4 - t3, 3),
        "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__,
                     "torch": torch.__version__},
    }
    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch DataLoader peer of the BERT-style text benchmark (bench/text.sh).

The recipe a PyTorch user writes for BERT input with a Hugging Face fast tokenizer: a map-style
Dataset over the JSON Lines of the corpus (the lines are read into memory once, untimed; each
item is `json.loads(line)["text"]`), a RandomSampler, batches of 256, `num_workers` = cores, and a
`collate_fn` that calls the tokenizer on the whole batch, `Tokenizer.encode_batch` (what
`transformers`' fast tokenizers call under `tokenizer(texts, padding="longest")`), with padding
to the longest of the batch enabled on the tokenizer, then makes int64 tensors `input_ids` and
`attention_mask` of shape [256, longest]. The workers hand the batches to the main process through
shared memory, as always.

Timed, as the image peers do: `--warmup` batches (default 5) are pulled untimed (worker start-up,
pipeline fill), then `--batches` (default 30) are timed as the main process receives them.
`items_per_s` is sentences/s; the line also has `tokens_per_s` (real tokens, [CLS] and [SEP]
included, padding not) and `padding_fraction` (padding cells over all cells of the timed
batches).

Configs (--config, repeatable; default: encode_batch):
  encode_batch        the recipe above
  encode_batch_fast   the same with `Tokenizer.encode_batch_fast` (tokenizers >= 0.21: no
                      character offsets are computed), for context

The tokenizer's own Rayon pool inside `encode_batch` is left as the library sets it up (on: the
main process does not use the tokenizer before the workers fork), which measured faster here than
turning it off; `--no-tokenizers-parallelism` sets TOKENIZERS_PARALLELISM=false to compare.
"""
import argparse
import json
import os
import time

from text_common import DEFAULT_DATA, corpus_files, cores

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = "pytorch-dataloader"
PIPELINE = "text-bert-wordpiece-pad-longest"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=DEFAULT_DATA, help="bench/gen_text.py's folder")
    ap.add_argument("--config", action="append", choices=["encode_batch", "encode_batch_fast"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=cores())
    ap.add_argument("--warmup", type=int, default=5, help="untimed batches")
    ap.add_argument("--batches", type=int, default=30, help="timed batches")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-tokenizers-parallelism", action="store_true")
    a = ap.parse_args()
    if a.no_tokenizers_parallelism:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    import tokenizers
    import torch
    from tokenizers import Tokenizer
    from torch.utils.data import DataLoader, Dataset, RandomSampler

    files = corpus_files(a.data)
    lines = []
    for path in files:
        with open(path, "rb") as f:
            lines.extend(f.readlines())

    class Lines(Dataset):
        def __len__(self):
            return len(lines)

        def __getitem__(self, i):
            return json.loads(lines[i])["text"]

    tok = Tokenizer.from_file(os.path.join(a.data, "wordpiece.json"))
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=pad_id, pad_token="[PAD]")  # to the longest of each batch

    def collate(texts, fast):
        encodings = tok.encode_batch_fast(texts) if fast else tok.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.int64)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.int64)
        return {"input_ids": ids, "attention_mask": mask}

    versions = {"torch": torch.__version__, "tokenizers": tokenizers.__version__}
    torch.manual_seed(a.seed)
    for cfg in a.config or ["encode_batch"]:
        fast = cfg == "encode_batch_fast"
        loader = DataLoader(
            Lines(),
            batch_size=a.batch,
            sampler=RandomSampler(range(len(lines))),
            num_workers=a.workers,
            collate_fn=lambda texts, fast=fast: collate(texts, fast),
            drop_last=True,
            persistent_workers=False,
        )
        it = iter(loader)
        t_start = time.perf_counter()
        for _ in range(a.warmup):
            next(it)
        first = time.perf_counter() - t_start
        t0 = time.perf_counter()
        items = tokens = cells = 0
        for _ in range(a.batches):
            b = next(it)
            mask = b["attention_mask"]
            items += mask.shape[0]
            tokens += int(mask.sum())
            cells += mask.numel()
        dt = time.perf_counter() - t0
        del it
        rec = {
            "system": SYSTEM,
            "pipeline": PIPELINE,
            "config": cfg,
            "items_per_s": round(items / dt, 2),
            "cores": cores(),
            "batches": a.batches,
            "items": items,
            "seconds": round(dt, 3),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "batch_size": a.batch,
            "workers": a.workers,
            "warmup_batches": a.warmup,
            "first_batch_s": round(first, 3),
            "tokens_per_s": round(tokens / dt, 1),
            "padding_fraction": round(1 - tokens / cells, 4),
            "tokenizers_parallelism": not a.no_tokenizers_parallelism,
            "versions": versions,
        }
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The text benchmarks, back to back on this machine: one JSON line per measurement on stdout (the
# peers' format), then one line per ratio (`"ratio": ...`, with its target and whether it is met).
# See bench/README.md.
#
#   bench/text.sh > text.jsonl
#   ROUNDS=3 bench/text.sh          # everything 3 times over; ratios of the medians
#
# Data: bench/gen_text.py writes (once, cached) a synthetic JSON Lines corpus (250,000 lines of
# log-normal length in 8 shards) and trains a BERT WordPiece (30k) and a byte-level BPE (32k)
# tokenizer on it.
#
# Measurements:
#   granary     text-bert-wordpiece-pad-longest  bench/text/bert.yaml: jsonl → text.tokenize
#               (pad-longest)                    (WordPiece) → batches of 256 padded to their
#                                                longest; `granary bench --fast-only`, WARMUP +
#                                                BERT_BATCHES batches
#   granary     ... (bucketed)                   bench/text/bert-bucketed.yaml: the same with
#                                                spec.batch.bucket
#   pytorch-dataloader ... (encode_batch)        bench/peers/text_bert_dataloader.py: DataLoader,
#                                                num_workers = cores, collate = encode_batch + pad
#                                                to longest; same batch counts
#   granary     text-bpe-pack2048 (epoch)        bench/text/pack.yaml: jsonl → text.tokenize (BPE)
#                                                → text.pack 2048 → batches of 8 rows; one whole
#                                                epoch timed from the start (`--warmup 0
#                                                --batches <the epoch's batches>`)
#   granary     text-bpe-pack2048 (steady)       the same, steady state (WARMUP + PACK_BATCHES)
#   hf-datasets text-bpe-pack2048                bench/peers/text_pack_datasets.py: load_dataset
#                                                → map(tokenize) → map(group_texts) → torch
#                                                batches of 8 rows, one epoch from the start
#
# Ratios:
#   bert_sentences_per_s       Granary pad-longest over the DataLoader               target >= 2
#   pack_tokens_per_s          Granary's epoch over the datasets epoch, tokens/s     target >= 3
#   padding_fraction           without and with bucketing (and the DataLoader's, which pads as
#                              the unbucketed manifest does)
#
# Env: TEXT_BENCH_DATA (default ~/.cache/granary-text-bench), PEERS_VENV (a Python with torch,
# tokenizers and datasets; default ~/.cache/granary-peers/venv; see
# bench/peers/requirements-text.txt), GRANARY (the binary; default: release build), WARMUP (5),
# BERT_BATCHES (200), PACK_BATCHES (300), ROUNDS (1).
#
# The whole script is one block, read before it runs.
{
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA="${TEXT_BENCH_DATA:-$HOME/.cache/granary-text-bench}"
VENV="${PEERS_VENV:-$HOME/.cache/granary-peers/venv}"
PY="$VENV/bin/python"
WARMUP="${WARMUP:-5}"
BERT_BATCHES="${BERT_BATCHES:-200}"
PACK_BATCHES="${PACK_BATCHES:-300}"
ROUNDS="${ROUNDS:-1}"
"$PY" -c 'import torch, tokenizers, datasets' 2>/dev/null ||
  { echo "$PY needs torch, tokenizers and datasets: $PY -m pip install -r bench/peers/requirements-text.txt" >&2; exit 2; }
TEXT_BENCH_DATA="$DATA" "$PY" bench/gen_text.py
if [ -z "${GRANARY:-}" ]; then
  cargo build --release -q -p granary-cli
  GRANARY="${CARGO_TARGET_DIR:-target}/release/granary"
fi
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
CORPUS="spec.source.url=file://$DATA/corpus/"

bert() { # MANIFEST CONFIG-LABEL
  echo "== granary $1 ($2)" >&2
  "$GRANARY" bench "$1" --json --fast-only --warmup "$WARMUP" --batches "$BERT_BATCHES" --set "$CORPUS" \
    --set "spec.stages[1].tokenizer=$DATA/wordpiece.json" --config "$2" | tee -a "$RESULTS"
}
pack() { # CONFIG-LABEL WARMUP BATCHES
  echo "== granary bench/text/pack.yaml ($1)" >&2
  "$GRANARY" bench bench/text/pack.yaml --json --fast-only --warmup "$2" --batches "$3" --set "$CORPUS" \
    --set "spec.stages[1].tokenizer=$DATA/bpe.json" --config "$1" | tee -a "$RESULTS"
}

# The batches of one packed epoch, from a run of it (which also warms the page cache).
EPOCH_BATCHES=$("$GRANARY" run bench/text/pack.yaml --workers 0 --json --epochs 1 --set "$CORPUS" \
  --set "spec.stages[1].tokenizer=$DATA/bpe.json" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["batches"])')
echo "== one packed epoch is $EPOCH_BATCHES batches" >&2

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round of $ROUNDS" >&2
  bert bench/text/bert.yaml pad-longest
  bert bench/text/bert-bucketed.yaml bucketed
  echo "== bench/peers/text_bert_dataloader.py" >&2
  TEXT_BENCH_DATA="$DATA" "$PY" bench/peers/text_bert_dataloader.py --warmup "$WARMUP" --batches "$BERT_BATCHES" |
    tee -a "$RESULTS"
  pack epoch 0 "$EPOCH_BATCHES"
  pack steady "$WARMUP" "$PACK_BATCHES"
  echo "== bench/peers/text_pack_datasets.py" >&2
  TEXT_BENCH_DATA="$DATA" "$PY" bench/peers/text_pack_datasets.py | tee -a "$RESULTS"
done

"$PY" - "$RESULTS" <<'EOF'
import json
import statistics
import sys

runs = {}  # (system, pipeline, config) -> [record of every round]
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        if r.get("items_per_s"):
            runs.setdefault((r["system"], r["pipeline"], r["config"]), []).append(r)


def med(system, pipeline, config, key="items_per_s"):
    """The median over the rounds."""
    seen = [r[key] for r in runs.get((system, pipeline, config), []) if r.get(key) is not None]
    return round(statistics.median(seen), 4) if seen else None


def out(**rec):
    rec["rounds"] = max(len(seen) for seen in runs.values())
    print(json.dumps(rec), flush=True)


BERT, PACK = "text-bert-wordpiece-pad-longest", "text-bpe-pack2048"
g, t = med("granary", BERT, "pad-longest"), med("pytorch-dataloader", BERT, "encode_batch")
if g and t:
    out(ratio="bert_sentences_per_s", value=round(g / t, 3), target=">= 2", met=g / t >= 2,
        granary_items_per_s=g, dataloader_items_per_s=t,
        granary_bucketed_items_per_s=med("granary", BERT, "bucketed"))
# Granary's tokens: rows x 2048, less the padding of the last row of each split (at most one
# row per split and epoch, under 0.3% of the rows here).
g, t = med("granary", PACK, "epoch"), med("hf-datasets", PACK, "datasets-map", "tokens_per_s")
if g and t:
    out(ratio="pack_tokens_per_s", value=round(g * 2048 / t, 3), target=">= 3", met=g * 2048 / t >= 3,
        granary_tokens_per_s=round(g * 2048), datasets_tokens_per_s=t,
        granary_steady_tokens_per_s=round((med("granary", PACK, "steady") or 0) * 2048))
plain, bucketed = med("granary", BERT, "pad-longest", "padding_fraction"), med("granary", BERT, "bucketed", "padding_fraction")
out(ratio="padding_fraction", without_bucketing=plain, with_bucketing=bucketed,
    dataloader=med("pytorch-dataloader", BERT, "encode_batch", "padding_fraction"))
EOF
exit
}

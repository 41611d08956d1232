#!/usr/bin/env bash
# The optimizer benchmark, back to back on this machine: nine pipelines, each measured with the
# optimizer on and off (`granary bench --compare-optimizer`: alternating rounds, medians) in one
# run; one JSON line per measurement on stdout (the peers' format plus `vs_unoptimized`), then one
# line per ratio (`"ratio": ...`, with its target and whether it is met). See bench/README.md.
#
#   bench/optimizer.sh > optimizer.jsonl
#
# Pipelines (batches: WARMUP + BATCHES per round, 3 rounds each side):
#   imagenet-train      bench/imagenet-float32.yaml: decode → RandomResizedCrop 224 → flip →
#                       float32 CHW (already in the best order: the control)
#   imagenet-val        bench/imagenet-val-float32.yaml: decode → resize 256 → centre crop 224 →
#                       float32 CHW; also against its unfused form (`vs_baseline`: full-size
#                       decode, one pass per stage)
#   image-misordered    bench/optimizer/image-misordered.yaml: the uint8 recipe with its HWC
#                       conversion written first; also image-handordered.yaml, the same stages
#                       in the right order
#   parquet             bench/optimizer/parquet-cast-select.yaml: cast, then select
#   bert                bench/optimizer/bert-select-after.yaml: tokenize → truncate/pad → select
#   python              bench/optimizer/python-jitter.yaml: a NumPy colour jitter as a python.map
#                       stage, with the flip written after the float32 normalization
#   python-lookup       bench/optimizer/python-lookup.yaml: a python.map stage that waits 2 ms
#                       per element (a lookup over the network); with the optimizer on, the
#                       worker tunes its compute threads
#   imagenet-distant    bench/imagenet-uint8.yaml with every read of the source delayed by
#                       STORE_LATENCY_MS (20): a `files` source on a distant object store; with
#                       the optimizer on, the reader tunes its reads in flight
#
# Ratios:
#   vs_unoptimized               per pipeline, optimizer on over off
#   misordered_vs_handordered    the mis-ordered pipeline (optimizer on) over the hand-ordered
#                                one                                               target >= 0.95
#   validation_vs_unfused        the validation recipe over its unfused form       target >= 2
#
# Data: the images are the peer benchmarks' (PEERS_DATA, default ~/.cache/granary-peers/data:
# their gen_data.py --what images); the text and the table are `granary demo --no-run`'s, made
# once under OPT_DATA (default ~/.cache/granary-optimizer-bench) with TEXT_LINES (200000) records
# and TABLE_ROWS (2000000) rows.
#
# Env: PEERS_DATA, OPT_DATA, STORE_LATENCY_MS, PYTHON (a Python with NumPy for the Python stage; default
# $PEERS_VENV/bin/python, PEERS_VENV defaulting to ~/.cache/granary-peers/venv), GRANARY (the
# binary; default: release build), WARMUP (5), BATCHES (30), THREADS (default: every core).
#
# The whole script is one block, read before it runs: a checkout that rewrites this file during
# a run cannot change what the run does.
{
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA="${PEERS_DATA:-$HOME/.cache/granary-peers/data}"
OPT_DATA="${OPT_DATA:-$HOME/.cache/granary-optimizer-bench}"
PY="${PYTHON:-${PEERS_VENV:-$HOME/.cache/granary-peers/venv}/bin/python}"
WARMUP="${WARMUP:-5}"
BATCHES="${BATCHES:-30}"
TEXT_LINES="${TEXT_LINES:-200000}"
TABLE_ROWS="${TABLE_ROWS:-2000000}"
STORE_LATENCY_MS="${STORE_LATENCY_MS:-20}"
[ -f "$DATA/images/labels.jsonl" ] || { echo "no benchmark images under $DATA: run the peers' gen_data.py --what images --out $DATA" >&2; exit 2; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "$PY needs NumPy (set PYTHON)" >&2; exit 2; }
if [ -z "${GRANARY:-}" ]; then
  . scripts/build-tools.sh
  cargo build --release -q -p granary-cli
  GRANARY="${CARGO_TARGET_DIR:-target}/release/granary"
fi
stamp="$OPT_DATA/.made-$TEXT_LINES-$TABLE_ROWS"
if [ ! -f "$stamp" ]; then
  echo "== generating $TEXT_LINES text records and $TABLE_ROWS Parquet rows under $OPT_DATA" >&2
  "$GRANARY" demo --no-run --dir "$OPT_DATA" --images 8 --text-lines "$TEXT_LINES" --table-rows "$TABLE_ROWS" >&2
  touch "$stamp"
fi
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

bench() { # MANIFEST LABEL [granary bench options...]
  local manifest=$1 label=$2
  shift 2
  echo "== granary bench $manifest ($label) $*" >&2
  "$GRANARY" bench "$manifest" --json --compare-optimizer --warmup "$WARMUP" --batches "$BATCHES" \
    ${THREADS:+--threads "$THREADS"} --pipeline "$label" "$@" | tee -a "$RESULTS"
}
images=(--set "spec.source.url=file://$DATA/images/train/")

bench bench/imagenet-float32.yaml imagenet-train --fast-only "${images[@]}"
bench bench/imagenet-val-float32.yaml imagenet-val "${images[@]}"
bench bench/optimizer/image-misordered.yaml image-misordered --fast-only "${images[@]}"
bench bench/optimizer/image-handordered.yaml image-handordered --fast-only "${images[@]}"
bench bench/optimizer/parquet-cast-select.yaml parquet --set "spec.source.url=file://$OPT_DATA/tables/"
bench bench/optimizer/bert-select-after.yaml bert --set "spec.source.url=file://$OPT_DATA/text/" \
  --set "spec.stages[0].tokenizer=$OPT_DATA/text/tokenizer.json"
PYTHONPATH="$PWD/bench/python${PYTHONPATH:+:$PYTHONPATH}" \
  bench bench/optimizer/python-jitter.yaml python --fast-only --python "$PY" "${images[@]}"
PYTHONPATH="$PWD/bench/python${PYTHONPATH:+:$PYTHONPATH}" \
  bench bench/optimizer/python-lookup.yaml python-lookup --fast-only --python "$PY" "${images[@]}"
GRANARY_TEST_SOURCE_THROTTLE="per_call_ms=$STORE_LATENCY_MS" \
  bench bench/imagenet-uint8.yaml imagenet-distant --fast-only "${images[@]}"

"$PY" - "$RESULTS" <<'EOF'
import json
import sys

runs = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[r["pipeline"]] = r


def out(**rec):
    print(json.dumps(rec), flush=True)


for name, r in runs.items():
    out(ratio="vs_unoptimized", pipeline=name, value=r.get("vs_unoptimized"), rewrites=r.get("rewrites"),
        optimized_items_per_s=r["items_per_s"], unoptimized_items_per_s=r.get("unoptimized_items_per_s"))
mis, hand = runs.get("image-misordered"), runs.get("image-handordered")
if mis and hand:
    v = mis["items_per_s"] / hand["items_per_s"]
    out(ratio="misordered_vs_handordered", value=round(v, 3), target=">= 0.95", met=v >= 0.95,
        misordered_items_per_s=mis["items_per_s"], handordered_items_per_s=hand["items_per_s"],
        misordered_unoptimized_items_per_s=mis.get("unoptimized_items_per_s"))
val = runs.get("imagenet-val")
if val and val.get("vs_baseline"):
    out(ratio="validation_vs_unfused", value=val["vs_baseline"], target=">= 2", met=val["vs_baseline"] >= 2,
        fused_items_per_s=val["items_per_s"], unfused_items_per_s=val.get("baseline_items_per_s"))
EOF
exit
}

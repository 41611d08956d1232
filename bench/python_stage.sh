#!/usr/bin/env bash
# The `python.map` benchmark, back to back on this machine (batches of 128, the peer benchmarks'
# synthetic ImageNet data): one JSON line per measurement on stdout (the peers' format), then one
# line per ratio (`"ratio": ...`, with its target and whether it is met). See bench/README.md.
#
#   bench/python_stage.sh > python_stage.jsonl
#   CONTEXT=0 bench/python_stage.sh            # without the context runs (marked below)
#   ROUNDS=3 bench/python_stage.sh             # everything 3 times over; ratios of the medians
#
# Measurements (granary runs are `granary bench --fast-only`: no baseline or decode-only runs):
#   granary     jitter-{float32,uint8}          bench/python/jitter-*.yaml: the ImageNet recipe
#                                               with colour_jitter.py's `jitter` as a python.map
#                                               stage after the crop, every core
#   dataloader  {float32,uint8}                 bench/peers/torch_jitter.py: the peers' DataLoader
#                                               recipe calling the same function after the crop
#   granary     {float32,uint8}                 the built-in recipe, bench/imagenet-*.yaml
#   granary     {float32,uint8}-identity        a python.map that returns its input, after the crop
#   granary     {float32,uint8}-split           control: `test.sleep` 0 ms instead (the same stage
#                                               boundaries, no Python)
#   granary     uint8-identity-batched          the identity stage with `batched: true` (one call
#                                               per 128 elements)
#   granary     uint8{,-split,-identity,-identity-batched}-t1
#                                               the same on one core (bound to CPU 0 with
#                                               taskset), for the crossing cost per element: the
#                                               Python ones with --threads 1, the others with
#                                               --threads 2 (the same two compute threads)
#   granary     burn uint8-t1, uint8-t2         a CPU-bound Python stage (pure-Python loop, ~3 ms
#                                               per element), --threads 1 on CPU 0, then 2 on
#                                               CPUs 0 and 1 (a pipeline with Python stages runs
#                                               one compute thread more than --threads: binding
#                                               keeps the core counts honest)
#   context (CONTEXT=1, default): the peers' own DataLoader recipe without jitter
#   (peers/torch_loader.py) and the DataLoader round trip through NumPy alone
#   (torch_jitter.py's *-identity configs).
#
# Ratios:
#   granary_vs_dataloader   jitter recipe, Granary over DataLoader, per dtype      target >= 1.5
#   identity_cost           1 - identity / built-in (share of throughput lost)     target <= 0.10
#                           (also against the -split control: Python alone);
#   identity_batched_cost   the same for the batched identity stage
#   burn_scaling            CPU-bound stage, 2 cores over 1                        target >= 1.7
#   crossing_us             on one core: 1e6/identity - 1e6/built-in, µs per element (one
#                           core's time per element with the stage, less without it); also
#                           1e6/identity - 1e6/split (the crossing alone, without the cost of
#                           leaving the fused operator);
#   crossing_batched_us     the same for the batched identity stage
#
# Env: PEERS_DATA (default ~/.cache/granary-peers/data), PEERS_VENV (a Python with NumPy, torch
# and torchvision; default ~/.cache/granary-peers/venv), PEERS_DIR (the peer benchmarks' folder,
# holding peers/common.py and peers/torch_loader.py; required), GRANARY (the binary; default:
# release build), WARMUP (5), BATCHES (30), ROUNDS (1).
#
# The whole script is one block, read before it runs: a checkout that rewrites this file during
# a run (which takes minutes) cannot change what the run does.
{
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA="${PEERS_DATA:-$HOME/.cache/granary-peers/data}"
VENV="${PEERS_VENV:-$HOME/.cache/granary-peers/venv}"
PY="$VENV/bin/python"
[ -n "${PEERS_DIR:-}" ] || { echo "set PEERS_DIR to the peer benchmarks' folder (peers/torch_loader.py)" >&2; exit 2; }
export PEERS_DIR
WARMUP="${WARMUP:-5}"
BATCHES="${BATCHES:-30}"
ROUNDS="${ROUNDS:-1}"
[ -f "$DATA/images/labels.jsonl" ] || { echo "no benchmark data under $DATA: run the peers' gen_data.py --what images --out $DATA" >&2; exit 2; }
"$PY" -c 'import numpy, torch, torchvision' 2>/dev/null ||
  { echo "$PY needs numpy, torch and torchvision (the peers' requirements-peers.txt)" >&2; exit 2; }
[ -f "$PEERS_DIR/peers/torch_loader.py" ] || { echo "no peer scripts under $PEERS_DIR: set PEERS_DIR" >&2; exit 2; }
if [ -z "${GRANARY:-}" ]; then
  cargo build --release -q -p granary-cli
  GRANARY="${CARGO_TARGET_DIR:-target}/release/granary"
fi
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

granary() { # MANIFEST CONFIG-LABEL [granary bench options...]
  local manifest=$1 label=$2
  shift 2
  echo "== granary $manifest ($label) $*" >&2
  ${PIN:+taskset -c "$PIN"} "$GRANARY" bench "$manifest" --json --fast-only --warmup "$WARMUP" --batches "$BATCHES" \
    --set "spec.source.url=file://$DATA/images/train/" --python "$PY" --config "$label" "$@" | tee -a "$RESULTS"
}
peer() { # SCRIPT [options...]
  local script=$1
  shift
  echo "== $script $*" >&2
  PEERS_DATA="$DATA" "$PY" "$script" --warmup "$WARMUP" --batches "$BATCHES" "$@" | tee -a "$RESULTS"
}

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round of $ROUNDS" >&2
  # 1. The jitter recipe: Granary, then the DataLoader with the same function.
  for dtype in float32 uint8; do
    granary "bench/python/jitter-$dtype.yaml" "$dtype"
  done
  peer bench/peers/torch_jitter.py --config float32 --config uint8
  # 2. What crossing into Python costs, every core: built-in, identity, and the no-Python control.
  for dtype in float32 uint8; do
    granary "bench/imagenet-$dtype.yaml" "$dtype"
    granary "bench/python/identity-$dtype.yaml" "$dtype-identity"
    granary "bench/python/split-$dtype.yaml" "$dtype-split"
  done
  # The identity stage with `batched: true` (one call per 128 elements instead of one per element).
  granary bench/python/identity-uint8.yaml uint8-identity-batched --set 'spec.stages[2].batched=true'
  # 3. The same on one core (the process bound to CPU 0): the crossing cost per element.
  # The controls run two compute threads on that core, as the Python pipelines do (one more
  # than --threads), so that the difference is the crossing alone.
  PIN=0 granary bench/imagenet-uint8.yaml uint8-t1 --threads 2
  PIN=0 granary bench/python/split-uint8.yaml uint8-split-t1 --threads 2
  PIN=0 granary bench/python/identity-uint8.yaml uint8-identity-t1 --threads 1
  PIN=0 granary bench/python/identity-uint8.yaml uint8-identity-batched-t1 --threads 1 --set 'spec.stages[2].batched=true'
  # 4. A CPU-bound Python stage on 1, then 2 cores (bound to CPU 0, then CPUs 0 and 1).
  PIN=0 granary bench/python/burn-uint8.yaml uint8-t1 --threads 1
  PIN=0,1 granary bench/python/burn-uint8.yaml uint8-t2 --threads 2
  # Context: the DataLoader without jitter, and its round trip through NumPy alone.
  if [ "${CONTEXT:-1}" = 1 ]; then
    peer "$PEERS_DIR/peers/torch_loader.py" --config float32 --config uint8
    peer bench/peers/torch_jitter.py --config float32-identity --config uint8-identity
  fi
done

"$PY" - "$RESULTS" <<'EOF'
import json
import statistics
import sys

runs = {}  # (system, pipeline, config) -> items/s of every round
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        if r.get("items_per_s"):
            runs.setdefault((r["system"], r["pipeline"], r["config"]), []).append(r["items_per_s"])


def rate(system, pipeline, config):
    """The median over the rounds."""
    seen = runs.get((system, pipeline, config))
    return round(statistics.median(seen), 2) if seen else None


def out(**rec):
    rec["rounds"] = max(len(seen) for seen in runs.values())
    print(json.dumps(rec), flush=True)


G, T = "granary", "pytorch-dataloader"
JIT, FLIP, BURN = "image-rrc224-jitter-flip", "image-rrc224-flip", "image-rrc224-burn-flip"
for dtype in ("float32", "uint8"):
    g, t = rate(G, JIT, dtype), rate(T, JIT, dtype)
    if g and t:
        out(ratio="granary_vs_dataloader", config=dtype, value=round(g / t, 3), target=">= 1.5",
            met=g / t >= 1.5, granary_items_per_s=g, dataloader_items_per_s=t)
for dtype in ("float32", "uint8"):
    b, i, s = rate(G, FLIP, dtype), rate(G, FLIP, f"{dtype}-identity"), rate(G, FLIP, f"{dtype}-split")
    if b and i:
        rec = dict(ratio="identity_cost", config=dtype, value=round(1 - i / b, 3), target="<= 0.10",
                   met=1 - i / b <= 0.10, builtin_items_per_s=b, identity_items_per_s=i)
        if s:
            rec.update(split_items_per_s=s, python_alone=round(1 - i / s, 3), fusion_alone=round(1 - s / b, 3))
        out(**rec)
b, i = rate(G, FLIP, "uint8"), rate(G, FLIP, "uint8-identity-batched")
if b and i:
    out(ratio="identity_batched_cost", config="uint8", value=round(1 - i / b, 3), target="<= 0.10",
        met=1 - i / b <= 0.10, builtin_items_per_s=b, identity_batched_items_per_s=i)
one, two = rate(G, BURN, "uint8-t1"), rate(G, BURN, "uint8-t2")
if one and two:
    out(ratio="burn_scaling", config="uint8", value=round(two / one, 3), target=">= 1.7", met=two / one >= 1.7,
        threads1_items_per_s=one, threads2_items_per_s=two,
        ms_per_element_threads1=round(1e3 / one, 3))
b, s, i = rate(G, FLIP, "uint8-t1"), rate(G, FLIP, "uint8-split-t1"), rate(G, FLIP, "uint8-identity-t1")
if b and i:
    rec = dict(ratio="crossing_us", config="uint8", threads=1, value=round(1e6 / i - 1e6 / b, 1),
               formula="1e6/identity_t1 - 1e6/builtin_t1", builtin_items_per_s=b, identity_items_per_s=i)
    if s:
        rec.update(split_items_per_s=s, python_alone_us=round(1e6 / i - 1e6 / s, 1),
                   fusion_alone_us=round(1e6 / s - 1e6 / b, 1))
    out(**rec)
i = rate(G, FLIP, "uint8-identity-batched-t1")
if b and i:
    out(ratio="crossing_batched_us", config="uint8", threads=1, value=round(1e6 / i - 1e6 / b, 1),
        formula="1e6/identity_batched_t1 - 1e6/builtin_t1", builtin_items_per_s=b, identity_batched_items_per_s=i)
for dtype in ("float32", "uint8"):
    plain, ident, jit = rate(T, FLIP, dtype), rate(T, FLIP, f"{dtype}-identity"), rate(T, JIT, dtype)
    if plain and jit:
        rec = dict(ratio="dataloader_jitter_cost", config=dtype, value=round(1 - jit / plain, 3),
                   plain_items_per_s=plain, jitter_items_per_s=jit)
        if ident:
            rec.update(identity_items_per_s=ident, identity_cost=round(1 - ident / plain, 3))
        out(**rec)
    gb, gj = rate(G, FLIP, dtype), rate(G, JIT, dtype)
    if gb and gj:
        out(ratio="granary_jitter_cost", config=dtype, value=round(1 - gj / gb, 3), builtin_items_per_s=gb,
            jitter_items_per_s=gj)
EOF
exit
}

#!/usr/bin/env bash
# The autocacher against `policy: never`, back to back on this machine, 3 runs each (one JSON
# summary line per run on stdout, a per-epoch median table on stderr):
#
# - photos: decode and resize of camera-sized JPEGs dominate: `auto` writes in the first epoch
#   and reads after; its reading epochs are compared with the rate the policy predicted;
# - photos behind a slow store (1 MB/s, the test-only throttle): reading would be slower than
#   computing, so `auto` computes; no epoch may be more than 5% slower than `never`.
#
# Env: DATA (default /tmp/granary-cache-bench), GRANARY (default: the release build), RUNS (3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA="${DATA:-/tmp/granary-cache-bench}"
RUNS="${RUNS:-3}"
if [ -z "${GRANARY:-}" ]; then
  cargo build --release -q -p granary-cli
  GRANARY=target/release/granary
fi
if [ ! -d "$DATA/photos" ]; then
  echo "== generating 300 camera-sized JPEGs under $DATA" >&2
  "$GRANARY" demo --no-run --images 300 --image-scale 6 --dir "$DATA/demo" >/dev/null
  # Four hard-linked copies under distinct names: 1200 elements an epoch, 150 MB on disk.
  mkdir -p "$DATA/photos.tmp"
  for copy in 0 1 2 3; do
    for f in "$DATA"/demo/images/train/*.jpg; do ln -f "$f" "$DATA/photos.tmp/c$copy-$(basename "$f")"; done
  done
  mv "$DATA/photos.tmp" "$DATA/photos"
fi
run() { # case policy [env...]
  local case=$1 policy=$2; shift 2
  rm -rf "$DATA/cache" && mkdir -p "$DATA/cache"
  env "$@" "$GRANARY" run bench/cache-photos.yaml --json \
    --set "spec.source.url=file://$DATA/photos/" --set "spec.cache.store=file://$DATA/cache/" \
    --set "spec.cache.policy=$policy" 2>/dev/null |
    python3 -c "import json,sys; s=json.load(sys.stdin); s['case']='$case'; s['policy']='$policy'; print(json.dumps(s))"
}
SLOW=GRANARY_TEST_CACHE_THROTTLE=get_per_byte_ns=1000,put_per_byte_ns=1000
out="$DATA/results.jsonl"
: > "$out"
for i in $(seq "$RUNS"); do
  echo "== run $i/$RUNS" >&2
  run photos auto X=1 >> "$out"
  run photos never X=1 >> "$out"
  run slow-store auto "$SLOW" >> "$out"
  run slow-store never "$SLOW" >> "$out"
done
cat "$out"
python3 bench/cache_summary.py < "$out" >&2

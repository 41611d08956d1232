#!/usr/bin/env bash
# Placement on one many-core machine: a trainer process on 2 cores of its own reads from 1 worker
# on 2 other cores, with placement on (the default: the trainer's client finishes the final
# float32 normalization, and makes a share of the images from the worker's plans, while its host
# has idle cores), with every image made on the trainer's host (GRANARY_IMAGES=client), and off
# (`granary worker --normalize-on-worker`, GRANARY_IMAGES=workers), in alternating runs; then
# once more with placement on while the rest of the machine is made busy for 12 s, printing the
# dispatcher's placement decisions. See bench/README.md (*Placement*).
#
#   cargo build --release -p granary-cli && cargo build -p granary-e2e --bin granary-e2e-consume
#   bench/placement.sh
#
# The worker advertises the machine's first address (`hostname -I`), not loopback: a client
# reading only from loopback workers keeps the finishing whatever its host's load. Needs 16
# cores (WORKER_CORES, TRAINER_CORES, DISPATCHER_CORES, BUSY_CORES name them), `taskset`, and
# python3 (to count the trainer's elements). LISTEN, IP, IMAGES and WINDOW ("FROM TO", seconds) try it
# small on loopback; ROUNDS (2) sets the alternations.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
GRANARY=${GRANARY:-$TARGET/release/granary}
CONSUME=${CONSUME:-$TARGET/debug/granary-e2e-consume}
WORKER_CORES=${WORKER_CORES:-0,1}
TRAINER_CORES=${TRAINER_CORES:-2,3}
DISPATCHER_CORES=${DISPATCHER_CORES:-4}
BUSY_CORES=${BUSY_CORES:-$(seq -s ' ' 2 15)}
WINDOW=${WINDOW:-8 38}
# The first non-loopback address: `hostname -I`, or where that is missing, what the host's name
# resolves to.
IP=${IP:-$( (hostname -I 2> /dev/null || true) | awk '{print $1}')}
IP=${IP:-$(python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')}
case "$IP" in
  "") echo "no address to advertise: set IP" >&2; exit 2 ;;
  127.*) echo "advertising loopback ($IP): the trainer keeps the finishing whatever its host's load" >&2 ;;
esac
WORK=$(mktemp -d)
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT

"$GRANARY" demo --dir "$WORK/data" --images "${IMAGES:-2000}" --image-scale 2 --no-run > /dev/null
URL=file://$WORK/data/images/train/

# Cores a process has used since a time (`date +%s.%N`): its user and system CPU over the wall
# time.
cores() {
  python3 -c '
import os, sys, time
pid, since = sys.argv[1], float(sys.argv[2])
fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print(f"{cpu / (time.time() - since):.2f}")' "$1" "$2" 2> /dev/null || echo "?"
}

# One run: $1 its label, $2 extra worker flags, $3 seconds before the machine is made busy (0:
# never), $4 where the trainer wants the images made (GRANARY_IMAGES: auto, client, workers).
run() {
  GRANARY_LOG=granary_dispatcher=info taskset -c "$DISPATCHER_CORES" "$GRANARY" run bench/imagenet-float32.yaml \
    --serve 127.0.0.1:0 --workers 0 --epochs 1000 --set "spec.source.url=$URL" > "$WORK/ready" 2> "$WORK/dispatcher.log" &
  local dispatcher=$!
  for _ in $(seq 100); do grep -q dispatcher "$WORK/ready" && break; sleep 0.1; done
  local address
  address=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["dispatcher"])' "$WORK/ready")
  # shellcheck disable=SC2086
  taskset -c "$WORKER_CORES" "$GRANARY" worker --dispatcher "$address" --threads 2 --listen "${LISTEN:-0.0.0.0}:7071" \
    --advertise "$IP:7071" --drain-timeout 0 $2 2> "$WORK/worker.log" &
  local worker=$!
  if [ "$3" != 0 ]; then
    (sleep "$3"; for c in $BUSY_CORES; do taskset -c "$c" timeout 12 sh -c 'while :; do :; done' & done; wait) &
  fi
  local rate started trainer
  started=$(date +%s.%N)
  # The trainer's CPU (user, system, wall seconds) as bash's `time` reports the pipeline's.
  trainer=$( { TIMEFORMAT='%U %S %R'; time {
    # shellcheck disable=SC2086
    GRANARY_IMAGES=$4 taskset -c "$TRAINER_CORES" "$CONSUME" --dispatcher "$address" --pipeline image-rrc224-flip 2> /dev/null \
      | python3 bench/consumer_rate.py $WINDOW > "$WORK/rate" || true; }; } 2>&1)
  rate=$(cat "$WORK/rate")
  echo "$1: $rate elements/s; cores used, whole run: trainer $(echo "$trainer" | awk '{printf "%.2f", ($1 + $2) / $3}'), worker $(cores "$worker" "$started")"
  kill "$worker" "$dispatcher" 2> /dev/null || true
  wait "$worker" "$dispatcher" 2> /dev/null || true
  sleep 1
  # The dispatcher's placement decisions, each with its time and the hosts' figures.
  grep -h "placement:" "$WORK/dispatcher.log" | sed 's/^\([^ ]*\) .*placement: /\1 /' || true
}

for _ in $(seq "${ROUNDS:-2}"); do
  run "placement on" "" 0 auto
  run "every image on the trainer's host" "" 0 client
  run "placement off (--normalize-on-worker, images on the worker)" "--normalize-on-worker" 0 workers
done
run "placement on, the machine made busy at 15 s for 12 s" "" 15 auto

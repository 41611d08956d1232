#!/usr/bin/env bash
# Placement's loop on a small machine (2 cores): how steadily the share of images the trainer's
# host makes settles, and what the trainer delivers meanwhile. The worker (`--threads 1`) has
# core 0; the trainer and the dispatcher share core 1. The trainer's host is emulated: its idle
# cores are `HOST_CORES` less the cores the trainer process used over the last half second,
# written every 0.1 s to the file the client reads in place of its host's counters
# (`GRANARY_TEST_HOST_IDLE`). With the default 1.6, the rule (which steers a host to 1.0 idle
# core) gives the trainer about 0.6 of its core for images and normalization. `BUSY="FROM TO
# CORES"` makes the host report `CORES` between those seconds, as if other work took it.
#
# Each run prints the trainer's elements a second (over `WINDOW`, "FROM TO" seconds), the moves
# of the share and the normalization the dispatcher logged, and the trainer's cores (mean and
# standard deviation of its 0.1-s samples over the window). `BASELINE` names another `granary`
# binary to alternate with (`ROUNDS` rounds); `IMAGES` (auto) is the trainer's
# `GRANARY_IMAGES`. See bench/README.md (*Placement*).
#
#   cargo build --release -p granary-cli && cargo build --release -p granary-e2e --bin granary-e2e-consume
#   bench/placement_emulated.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
GRANARY=${GRANARY:-$TARGET/release/granary}
CONSUME=${CONSUME:-$TARGET/release/granary-e2e-consume}
HOST_CORES=${HOST_CORES:-1.6}
WINDOW=${WINDOW:-6 36}
WORK=$(mktemp -d)
trap 'pkill -P $$ || true; rm -rf "$WORK"' EXIT

"$GRANARY" demo --dir "$WORK/data" --images "${DEMO_IMAGES:-2000}" --image-scale 2 --no-run > /dev/null
URL=file://$WORK/data/images/train/

# The emulated host: $1 the file holding the trainer's pid, $2 the idle file to write.
host() {
  python3 -c '
import os, sys, time
pid_file, out, cores = sys.argv[1], sys.argv[2], float(sys.argv[3])
busy = [float(x) for x in os.environ.get("BUSY", "").split()]
tick = os.sysconf("SC_CLK_TCK")
while not (os.path.exists(pid_file) and open(pid_file).read().strip()):
    time.sleep(0.05)
pid, start, seen = open(pid_file).read().strip(), time.monotonic(), []
while True:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        break
    now, cpu = time.monotonic(), (int(fields[11]) + int(fields[12])) / tick
    seen = [s for s in seen if now - s[0] <= 0.55] + [(now, cpu)]
    if now - seen[0][0] > 0.3:
        used = (cpu - seen[0][1]) / (now - seen[0][0])
        have = busy[2] if len(busy) == 3 and busy[0] <= now - start < busy[1] else cores
        with open(out + ".tmp", "w") as f:
            f.write(f"{max(0.0, have - used):.3f}")
        os.replace(out + ".tmp", out)
        with open(out + ".trace", "a") as f:
            f.write(f"{now - start:.2f} {used:.3f}\n")
    time.sleep(0.1)' "$1" "$2" "$HOST_CORES"
}

# One run: $1 its label, $2 the granary binary.
run() {
  rm -f "$WORK"/pid "$WORK"/idle*
  echo 2.0 > "$WORK/idle"
  GRANARY_LOG=granary_dispatcher=info taskset -c 1 "$2" run bench/imagenet-float32.yaml --serve 127.0.0.1:0 \
    --workers 0 --epochs 1000 --set "spec.source.url=$URL" > "$WORK/ready" 2> "$WORK/dispatcher.log" &
  local dispatcher=$!
  for _ in $(seq 100); do grep -q dispatcher "$WORK/ready" && break; sleep 0.1; done
  local address
  address=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["dispatcher"])' "$WORK/ready")
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  taskset -c 0 "$2" worker --dispatcher "$address" --threads 1 --listen "127.0.0.1:$port" \
    --advertise "127.0.0.1:$port" --drain-timeout 0 2> "$WORK/worker.log" &
  local worker=$!
  host "$WORK/pid" "$WORK/idle" &
  local emulated=$!
  { GRANARY_TEST_HOST_IDLE=$WORK/idle GRANARY_IMAGES=${IMAGES:-auto} taskset -c 1 "$CONSUME" \
      --dispatcher "$address" --pipeline image-rrc224-flip 2> /dev/null & echo $! > "$WORK/pid"; wait; } |
    python3 bench/consumer_rate.py $WINDOW > "$WORK/rate" || true
  kill "$(cat "$WORK/pid")" "$worker" "$dispatcher" "$emulated" 2> /dev/null || true
  wait "$worker" "$dispatcher" "$emulated" 2> /dev/null || true
  local moves normalization cores
  moves=$(grep -c "share of images" "$WORK/dispatcher.log" || true)
  normalization=$(grep -c "final normalization moves" "$WORK/dispatcher.log" || true)
  cores=$(python3 -c '
import statistics, sys
lo, hi = map(float, sys.argv[2:4])
used = [float(l.split()[1]) for l in open(sys.argv[1]) if lo <= float(l.split()[0]) < hi]
print(f"{statistics.mean(used):.2f} ± {statistics.pstdev(used):.2f}" if used else "?")' "$WORK/idle.trace" $WINDOW)
  echo "$1: $(cat "$WORK/rate") elements/s; the share moved $moves times, the normalization $normalization; trainer cores $cores"
  grep -h "placement:" "$WORK/dispatcher.log" | sed 's/^\([^ ]*\) .*placement: /\1 /' | cut -c12-200 > "$WORK/moves"
  [ "${VERBOSE:-0}" = 0 ] || cat "$WORK/moves"
}

for _ in $(seq "${ROUNDS:-1}"); do
  run "placement" "$GRANARY"
  [ -z "${BASELINE:-}" ] || run "baseline ($BASELINE)" "$BASELINE"
done

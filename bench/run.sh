#!/usr/bin/env bash
# Granary's image pipeline next to the peer benchmarks, back to back on this machine: one JSON
# line per (system, config) on stdout, in the peers' format.
#
#   bench/run.sh > results.jsonl               # granary float32, uint8 and the validation recipe,
#                                              # then the peers (with bench/peers/torch_val.py)
#   PEERS=0 bench/run.sh                       # granary only
#   ONLY="torch tfdata" bench/run.sh           # peer subset, passed to run_peers.sh
#   SERVED=1 bench/run.sh                      # the served path instead: 1 worker → 1 client over
#                                              # loopback, then tf.data service (distributed_epoch,
#                                              # 1 worker) with the peers' script
#
# Env: PEERS_DIR (the peer benchmark scripts: gen_data.py, run_peers.sh), PEERS_DATA (their
# data, default ~/.cache/granary-peers/data), GRANARY (the binary, default: release build),
# ROUNDS (3: Granary's fast path, baseline and decode-only limit are measured in turn this many
# times, each round with the peers' settings, and the median round of each is reported).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA="${PEERS_DATA:-$HOME/.cache/granary-peers/data}"
[ -f "$DATA/images/labels.jsonl" ] || { echo "no benchmark data under $DATA: run the peers' gen_data.py --what images --out $DATA" >&2; exit 2; }
if [ -z "${GRANARY:-}" ]; then
  cargo build --release -q -p granary-cli
  GRANARY=target/release/granary
fi
if [ "${SERVED:-0}" = 1 ]; then
  for config in float32 uint8; do
    echo "== granary $config, served by 1 worker over loopback" >&2
    "$GRANARY" bench "bench/imagenet-$config.yaml" --json --warmup 5 --batches 30 --workers 1 \
      --set "spec.source.url=file://$DATA/images/train/"
  done
  if [ "${PEERS:-1}" = 1 ]; then
    [ -n "${PEERS_DIR:-}" ] || { echo "set PEERS_DIR to the peer benchmarks' folder (or PEERS=0)" >&2; exit 2; }
    PY="${PEERS_VENV:-$HOME/.cache/granary-peers/venv}/bin/python"
    PEERS_DATA="$DATA" "$PY" "$PEERS_DIR/peers/tfdata_service.py" --mode distributed_epoch --workers 1 \
      --dtype float32 --dtype uint8 --compression None --warmup 5 --batches 30
  fi
  exit 0
fi
for config in float32 uint8 val-float32; do
  echo "== granary $config" >&2
  "$GRANARY" bench "bench/imagenet-$config.yaml" --json --warmup 5 --batches 30 --rounds "${ROUNDS:-3}" \
    --set "spec.source.url=file://$DATA/images/train/"
done
if [ "${PEERS:-1}" = 1 ]; then
  [ -n "${PEERS_DIR:-}" ] || { echo "set PEERS_DIR to the peer benchmarks' folder (or PEERS=0)" >&2; exit 2; }
  ONLY="${ONLY:-torch tfdata}" PEERS_DATA="$DATA" "$PEERS_DIR/run_peers.sh"
  # The validation recipe's DataLoader peer (the peers' folder has the train recipe only).
  case " ${ONLY:-torch tfdata} " in
    *" torch "*)
      PY="${PEERS_VENV:-$HOME/.cache/granary-peers/venv}/bin/python"
      PEERS_DIR="$PEERS_DIR" PEERS_DATA="$DATA" "$PY" bench/peers/torch_val.py --warmup 5 --batches 30 ;;
  esac
fi

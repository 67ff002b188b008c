#!/usr/bin/env bash
# Server-side cost of Palisade's Redis scripts vs the raw commands, with Redis as the bottleneck
# (redis-benchmark, 8 connections, 32-deep pipelines): no Rust client is involved, so this is
# the ceiling any client can reach. Prints a Markdown table. Starts and stops its own Redis.
#
#   integration/benches/scripts/redis-server-cost.sh [requests per row, default 1000000]
set -euo pipefail
cd "$(dirname "$0")/../.."
state=$(mktemp -d /tmp/palisade-cost.XXXXXX)
trap 'cargo run -q -p palisade-lab -- down "$state"' EXIT
cargo run -q -p palisade-lab -- up "$state" redis >/dev/null
# shellcheck source=/dev/null
source "$state/env"
port=${PALISADE_REDIS_URL##*:}
n=${1:-1000000}
cli() { redis-cli -p "$port" "$@"; }
# The scripts exactly as backends/redis/src/scripts.rs sends them (whitespace aside).
acquire=$(cli SCRIPT LOAD "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, redis.call('INCR', KEYS[2])} end return {0, redis.call('PTTL', KEYS[1])}")
release=$(cli SCRIPT LOAD "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0")
rps() { # prints requests/s of one redis-benchmark row
  redis-benchmark -p "$port" -c 8 -P 32 -n "$n" -r 100000 -q "$@" 2>/dev/null | tr '\r' '\n' |
    sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1
}
printf '| command | requests/s | µs each |\n|---|---|---|\n'
us=()
row() {
  local label=$1 r
  shift
  r=$(rps "$@")
  us+=("$(echo "1000000 / $r" | bc -l)")
  printf '| %s | %.0f | %.2f |\n' "$label" "$r" "${us[-1]}"
}
# Each script row runs right after a row that leaves its keys in the state the script expects.
row 'raw `SET lock NX PX`' SET 'lock:__rand_int__' tok NX PX 60000
row 'raw `DEL lock`' DEL 'lock:__rand_int__'
row 'acquire script (SET NX PX + INCR)' EVALSHA "$acquire" 2 'lock:__rand_int__' 'fence:__rand_int__' tok 60000
row 'release script (GET, compare, DEL, PUBLISH)' EVALSHA "$release" 1 'lock:__rand_int__' tok 'palisade:released:x'
printf '\nServer time per cycle: raw %.2f µs, palisade %.2f µs: a server-bound palisade reaches at most %.2f× raw throughput.\n' \
  "$(echo "${us[0]} + ${us[1]}" | bc -l)" "$(echo "${us[2]} + ${us[3]}" | bc -l)" \
  "$(echo "(${us[0]} + ${us[1]}) / (${us[2]} + ${us[3]})" | bc -l)"

#!/usr/bin/env bash
# Server-side cost of Palisade's Redis scripts vs the raw commands and the minimal fenced
# scripts, with Redis as the bottleneck: no Rust client is involved, so this is the ceiling any
# client can reach. Each row sends N requests on N distinct keys down one pipelined connection
# (redis-cli --pipe), so every acquire is a fresh grant and every release finds its lock held:
# the paths a lock cycle takes. (redis-benchmark's random keys repeat, and then measure the
# cheap "held" and "not the holder" paths instead.) Figures: requests/s of the whole stream,
# and the time Redis itself spent per call (INFO commandstats). Prints a Markdown table.
# Starts and stops its own Redis.
#
#   integration/benches/scripts/redis-server-cost.sh [requests per row, default 300000]
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=integration/benches/scripts/lab.sh
source integration/benches/scripts/lab.sh
lab_up redis
port=${PALISADE_REDIS_URL##*:}
n=${1:-300000}
cli() { redis-cli -p "$port" "$@"; }
# Palisade's scripts are read from backends/redis/src/scripts.rs itself (the text between
# `r"` and `",` after `pub static NAME`), so this table never measures a stale copy.
script_of() {
  local text
  text=$(awk -v name="pub static $1:" '
    index($0, name) { found = 1 }
    found && /r"$/ { inside = 1; next }
    inside && /^ *",$/ { exit }
    inside { print }
  ' backends/redis/src/scripts.rs)
  if [ -z "$text" ]; then
    echo "no script $1 in backends/redis/src/scripts.rs" >&2
    exit 1
  fi
  cli SCRIPT LOAD "$text"
}
acquire=$(script_of ACQUIRE)
release=$(script_of RELEASE)
# The least a fenced lock can send (palisade-compare's `redis_minimal_fenced`).
minimal_acquire=$(cli SCRIPT LOAD "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0")
minimal_release=$(cli SCRIPT LOAD "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
# One owner token for every variant, as long as Palisade's (128 bits in hex).
token=0123456789abcdef0123456789abcdef
# Prints the RESP stream of N commands: the words given, with `@` replaced by the request's
# number (each request its own resource).
stream() {
  awk -v n="$n" -v words="$*" 'BEGIN {
    count = split(words, w, " ")
    for (j = 1; j <= count; j++) {
      at = index(w[j], "@")
      if (at) { pre[j] = substr(w[j], 1, at - 1); post[j] = substr(w[j], at + 1) }
    }
    for (i = 0; i < n; i++) {
      printf "*%d\r\n", count
      for (j = 1; j <= count; j++) {
        word = (j in pre) ? pre[j] i post[j] : w[j]
        printf "$%d\r\n%s\r\n", length(word), word
      }
    }
  }'
}
# Times N requests of one kind down one pipelined connection; prints "requests/s µs-per-call"
# (the second from Redis itself: INFO commandstats of COMMAND).
measure() {
  local command=$1 file started ended
  shift
  file=$(mktemp "$state/stream.XXXXXX")
  stream "$@" >"$file"
  cli CONFIG RESETSTAT >/dev/null
  started=$(date +%s%N)
  cli --pipe <"$file" >/dev/null
  ended=$(date +%s%N)
  rm -f "$file"
  printf '%s %s\n' "$(echo "$n * 1000000000 / ($ended - $started)" | bc -l)" \
    "$(cli INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$command:.*usec_per_call=\([0-9.]*\).*/\1/p")"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
labels=(
  'raw `SET lock NX PX`' 'raw `DEL lock`'
  'minimal fenced acquire (`SET NX PX` + `INCR`)' 'minimal fenced release (`GET`, compare, `DEL`)'
  'Palisade acquire script, a fresh grant' 'Palisade release script, nobody waiting'
)
rounds=${ROUNDS:-5}
results=$(mktemp "$state/results.XXXXXX")
# Interleaved rounds; each variant's acquire row starts on an empty server (FLUSHALL), so every
# variant grows the same keyspace in the same steps, and its release row deletes those locks.
for round in $(seq "$rounds"); do
  cli FLUSHALL >/dev/null
  echo "0 $(measure set SET 'lock:{b:@}' "$token" NX PX 60000)" >>"$results"
  echo "1 $(measure del DEL 'lock:{b:@}')" >>"$results"
  cli FLUSHALL >/dev/null
  echo "2 $(measure evalsha EVALSHA "$minimal_acquire" 2 'lock:{m:@}' 'fence:{m:@}' "$token" 60000)" >>"$results"
  echo "3 $(measure evalsha EVALSHA "$minimal_release" 1 'lock:{m:@}' "$token")" >>"$results"
  cli FLUSHALL >/dev/null
  echo "4 $(measure evalsha EVALSHA "$acquire" 2 'lock:{p:@}' 'fence:{p:@}' "$token" 60000)" >>"$results"
  echo "5 $(measure evalsha EVALSHA "$release" 1 'lock:{p:@}' "$token" 'palisade:released:x')" >>"$results"
  echo "round $round of $rounds done" >&2
done
printf 'Medians of %d interleaved rounds of %d requests each.\n\n' "$rounds" "$n"
printf '| command | requests/s (one pipelined connection) | µs per call inside Redis |\n|---|---|---|\n'
rates=()
for row in 0 1 2 3 4 5; do
  rate=$(awk -v r="$row" '$1 == r { print $2 }' "$results" | median)
  usec=$(awk -v r="$row" '$1 == r { print $3 }' "$results" | median)
  rates+=("$rate")
  printf '| %s | %.0f | %s |\n' "${labels[$row]}" "$rate" "$usec"
done
cycle() { echo "1 / (1 / ${rates[$1]} + 1 / ${rates[$2]})" | bc -l; }
printf '\nCycles per second, server-bound (acquire + release): raw %.0f, minimal fenced %.0f, Palisade %.0f: Palisade reaches %.2f× raw and %.2f× the minimal fenced pair.\n' \
  "$(cycle 0 1)" "$(cycle 2 3)" "$(cycle 4 5)" \
  "$(echo "$(cycle 4 5) / $(cycle 0 1)" | bc -l)" "$(echo "$(cycle 4 5) / $(cycle 2 3)" | bc -l)"

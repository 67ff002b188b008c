# shellcheck shell=bash
# The workspace's test binaries, run side by side (sourced by scripts/test).
#
# `cargo test` runs one test binary at a time, and most of the suite's binaries spend their time
# waiting (on TTLs, on restarted servers, on partitions that heal), not on the CPU: one at a
# time, CI waited 18 minutes for them. Here `cargo test` builds them as ever, but its runner
# only records how it would run each binary (from which directory, with which environment and
# arguments: record-test-binary); then they run a few at once, the longest first, each with its
# output kept apart and printed whole when it ends, and a time bound of its own: a binary that
# never returns fails the run instead of holding it.
#
# Binaries running side by side share the machine's loopback: palisade-lab hands each process
# ports and lab subnets no other process holds (lab/src/claims.rs), and every test names its
# keys, tables and data directories itself.

# Test binaries known to run longest, as globs over their labels (test_binary_label): they
# start first, so that the short ones fill the slots around them instead of a long one starting
# last. Any binary not listed runs too, after these.
TEST_BINARIES_LONG_FIRST=(
  'palisade-compare: quick'
  'palisade-compare: torture'
  'doc tests'
  'palisade-integration: dynamodb_e2e'
  'palisade-conformance: broken'
  '*: conformance'
  'palisade-integration: partitions'
  'palisade-redis: sentinel'
)

# A recorded test binary's name as the lists here give it: "PACKAGE: BINARY", where BINARY is
# the test target's name (a file of tests/, or the package's crate for its unit tests).
test_binary_label() {
  local package exe
  package=$(tr '\0' '\n' <"$1/env" | sed -n 's/^CARGO_PKG_NAME=//p')
  exe=$(tr '\0' '\n' <"$1/args" | head -n 1)
  exe=$(basename "$exe")
  printf '%s: %s\n' "$package" "${exe%-*}"
}

# Test binaries of which at most one runs at a time (beside any light one): every
# certification (found by its source, see is_heavy), whose load scenario holds 500 grants and
# writes a second through the machine's servers with a bound of 2 s on each call (two of them
# side by side failed it), and these, which start servers of their own by the dozen or lean on a
# CPU-bound one (moto), or, as the torture, hold client processes and servers busy with calls
# whose bounds the checker judges.
TEST_BINARIES_HEAVY=(
  'palisade-compare: torture'
  'palisade-integration: dynamodb_e2e'
  'palisade-integration: partitions'
)

# Test binaries that run alone, before the others: the Redis + PostgreSQL load test holds 500
# acquisitions a second for a minute, and beside another binary the two cores cannot keep up
# with it (thousands of its jobs timed out waiting for a lock).
TEST_BINARIES_ALONE=(
  'palisade-integration: redis_postgres_soak'
)

# Extra arguments for a binary's libtest, by label. The broken twins (one per scenario,
# each made to fail it) mostly wait on TTLs and bounds: 8 s of CPU in 90 s of wall time eight
# at a time, against 323 s one per core.
test_binary_args() {
  case "$1" in
    'palisade-conformance: broken') echo "--test-threads 8" ;;
  esac
}

# run_test_binaries JOBS BOUND_SECONDS CARGO_TEST_ARGS…
# Runs `cargo test CARGO_TEST_ARGS… --lib --bins --tests` with a runner (record-test-binary)
# that only records how cargo would run each test binary, so cargo builds them as ever; then
# runs the recorded binaries JOBS at a time, each for at most BOUND_SECONDS, from the directory,
# with the environment and arguments cargo gave it, and `cargo test CARGO_TEST_ARGS… --doc` as
# one more job among them. Prints each binary's output when it ends,
# then one line per binary with its time and verdict. Returns 1 if the build or a doc test
# failed, or any binary failed or was killed at its bound.
run_test_binaries() {
  local jobs=$1 bound=$2
  shift 2
  case "$jobs" in '' | *[!0-9]* | 0)
    echo "run_test_binaries: JOBS must be a whole number of at least 1, not '$jobs'" >&2
    return 1
    ;;
  esac
  local root work failed=0
  root=$(pwd)
  work=$(mktemp -d)
  mkdir "$work/binaries"
  local built=$SECONDS
  if ! PALISADE_TEST_BINARIES="$work/binaries" cargo test "$@" --lib --bins --tests \
    --config "target.'cfg(all())'.runner = ['$root/scripts/lib/record-test-binary']"; then
    echo "the test binaries did not build" >&2
    rm -rf "$work"
    return 1
  fi
  echo "built the test binaries in $((SECONDS - built)) s"
  if ! compgen -G "$work/binaries/binary.*" >/dev/null; then
    # A runner set elsewhere (CARGO_TARGET_<triple>_RUNNER) takes precedence over ours.
    echo "cargo ran no test binary through record-test-binary: is another runner configured?" >&2
    rm -rf "$work"
    return 1
  fi
  # The doc tests run in the pool too, as one more job: compiling them is most of their minute,
  # which the binaries that wait on servers leave the CPU for.
  local doc="$work/binaries/binary.doc"
  mkdir "$doc"
  pwd >"$doc/cwd"
  env -0 >"$doc/env"
  printf '%s\0' cargo test "$@" --doc >"$doc/args"
  echo "doc tests" >"$doc/label"

  # Each binary's label, once; then the long ones first, in the order listed, and the rest in
  # the order cargo ran them.
  local pattern record
  local -a records ordered=()
  local -A label_for placed
  # (From a file, not a process substitution: `wait -n` below would take that for a job.)
  ls -1tr -d "$work"/binaries/binary.* >"$work/recorded"
  mapfile -t records <"$work/recorded"
  for record in "${records[@]}"; do
    if [ -f "$record/label" ]; then label_for[$record]=$(cat "$record/label"); else label_for[$record]=$(test_binary_label "$record"); fi
  done
  for pattern in "${TEST_BINARIES_ALONE[@]}" "${TEST_BINARIES_LONG_FIRST[@]}" '*'; do
    for record in "${records[@]}"; do
      # shellcheck disable=SC2254 # the pattern is a glob on purpose
      case "${label_for[$record]}" in $pattern)
        [ -n "${placed[$record]:-}" ] || { ordered+=("$record"); placed[$record]=1; } ;;
      esac
    done
  done

  local -A label_of started_at log_of
  local -a summary=()
  local running=0 n=0 pid status label
  finish() {
    local pid=$1 status=$2 label verdict=ok
    if [ -z "$pid" ] || [ -z "${label_of[$pid]:-}" ]; then
      echo "test-binaries: wait returned no job of ours (pid '${pid}', status $status); $running still running" >&2
      # 127: nothing left to wait for, though the count says otherwise (a bookkeeping fault,
      # which must not pass for a green run).
      [ "$status" -ne 127 ] || { running=0; failed=1; }
      return
    fi
    label=${label_of[$pid]}
    running=$((running - 1))
    [ "$status" -eq 0 ] || { verdict="FAILED (exit $status)"; failed=1; }
    [ "$status" -ne 124 ] || verdict="KILLED at its bound of $bound s"
    [ "$status" -ne 137 ] || verdict="KILLED (at its bound of $bound s, or by the kernel: see dmesg)"
    printf '\n--- %s: %s, %d s ---\n' "$label" "$verdict" $((SECONDS - started_at[$pid]))
    cat "${log_of[$pid]}"
    summary+=("$(printf '%6d s  %6s s CPU  %-50s %s' $((SECONDS - started_at[$pid])) "$(cat "${log_of[$pid]%.log}.cpu" 2>/dev/null)" "$label" "$verdict")")
  }
  # Which list a label is on.
  on_list() {
    local label=$1 pattern
    shift
    for pattern in "$@"; do
      # shellcheck disable=SC2254 # the pattern is a glob on purpose
      case "$label" in $pattern) return 0 ;; esac
    done
    return 1
  }
  local -a environment arguments
  local heavy_pid=
  launch() {
    local record=$1 label=$2
    mapfile -d '' -t environment <"$record/env"
    mapfile -d '' -t arguments <"$record/args"
    # shellcheck disable=SC2046 # the extra arguments are words
    (
      cd "$(cat "$record/cwd")" || exit
      status=0
      env -i "${environment[@]}" timeout --kill-after=30 "$bound" "${arguments[@]}" $(test_binary_args "$label") || status=$?
      # The CPU time of the binary and of the servers it started and reaped (`times`' second
      # line: this subshell's children), which decides what can run beside it.
      # (Redirected, not piped: a pipe would run `times` in a child with no children.)
      times >"$work/$n.times"
      sed -n 2p "$work/$n.times" | awk '{ split($1, u, "m"); split($2, s, "m"); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' >"$work/$n.cpu"
      exit "$status"
    ) >"$work/$n.log" 2>&1 </dev/null &
    pid=$!
    log_of[$pid]="$work/$n.log"
    label_of[$pid]=$label
    started_at[$pid]=$SECONDS
    running=$((running + 1))
    n=$((n + 1))
  }
  wait_for_one() {
    status=0
    wait -n -p pid || status=$?
    pid=${pid:-}
    [ "$pid" != "$heavy_pid" ] || heavy_pid=
    finish "$pid" "$status"
  }
  # Heavy: on the list, or a certification (its tests' file calls certify!, and every
  # certification holds the load scenario's 500 grants a second).
  is_heavy() {
    local record=$1 label=$2 source
    on_list "$label" "${TEST_BINARIES_HEAVY[@]}" && return 0
    source="$(cat "$record/cwd")/tests/${label#*: }.rs"
    [ -f "$source" ] && grep -q 'certify!' "$source"
  }

  # Those that run alone, one after the other; then the rest, JOBS at a time with at most one
  # heavy binary among them, the first in the order that may start taking the free slot.
  local -a queue=()
  local -A heavy_for
  for record in "${ordered[@]}"; do
    label=${label_for[$record]}
    if on_list "$label" "${TEST_BINARIES_ALONE[@]}"; then
      launch "$record" "$label"
      while [ "$running" -gt 0 ]; do wait_for_one; done
    else
      queue+=("$record")
      if is_heavy "$record" "$label"; then heavy_for[$record]=1; else heavy_for[$record]=0; fi
    fi
  done
  local i pick
  while [ "${#queue[@]}" -gt 0 ]; do
    pick=
    if [ "$running" -lt "$jobs" ]; then
      for i in "${!queue[@]}"; do
        if [ -n "$heavy_pid" ] && [ "${heavy_for[${queue[$i]}]}" -eq 1 ]; then
          continue
        fi
        pick=$i
        break
      done
    fi
    if [ -z "$pick" ]; then
      wait_for_one
      continue
    fi
    record=${queue[$pick]}
    launch "$record" "${label_for[$record]}"
    [ "${heavy_for[$record]}" -eq 0 ] || heavy_pid=$pid
    queue=("${queue[@]:0:pick}" "${queue[@]:pick+1}")
  done
  while [ "$running" -gt 0 ]; do wait_for_one; done

  printf '\n==> %d test binaries, %d at a time (slowest first)\n' "$n" "$jobs"
  printf '%s\n' "${summary[@]}" | sort -rn
  local passed failures
  passed=$(cat "$work"/*.log | sed -nE 's/^test result: .*\. ([0-9]+) passed.*/\1/p' | awk '{s += $1} END {print s + 0}')
  failures=$(cat "$work"/*.log | sed -nE 's/^test result: .* ([0-9]+) failed.*/\1/p' | awk '{s += $1} END {print s + 0}')
  printf '%d tests passed, %d failed\n' "$passed" "$failures"
  rm -rf "$work"
  return "$failed"
}

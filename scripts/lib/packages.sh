# shellcheck shell=bash
# The published crates, checked as a user's build would see them (sourced by scripts/test).
#
# Every workspace crate but the unpublished ones (publish = false: tests, benchmarks, examples,
# tools) is packaged (a new crate is packaged unless excluded here), then unpacked into a
# workspace of its own whose crates find each other through [patch.crates-io], as a user's
# build finds them on the registry. The feature matrix runs there, on exactly what would be
# published: `cargo check` of the packaged sources, each once per feature set (the build
# `cargo package` would verify with is the same compilation plus code generation, and cost CI
# another five minutes).
#
# All of it uses a target directory of its own (TARGET below), so that it can run while other
# cargo commands build the workspace: scripts/test runs it in the background, on the CPU time
# the test binaries leave idle.

# Packages the published crates and checks them feature by feature, in TARGET (an absolute
# path, created if missing). Needs every dependency downloaded (it runs offline) and cargo-hack.
check_packages() {
  local target=$1 packaged crate dir pair
  local -a members=() patches=()
  mkdir -p "$target"
  rm -f "$target"/package/*.crate
  CARGO_TARGET_DIR="$target" cargo package --offline --allow-dirty --no-verify --workspace \
    --exclude palisade-compare --exclude palisade-examples --exclude palisade-integration \
    --exclude palisade-model --exclude palisade-backend-template --exclude palisade-fuzz \
    --exclude palisade-public-api || return 1
  packaged="$target/package/unpacked"
  rm -rf "$packaged"
  mkdir -p "$packaged"
  for crate in "$target"/package/*.crate; do
    # Extracted with the current time (-m): a .crate keeps its files' old times, and cargo would
    # take a crate checked by an earlier run (of other sources) for fresh.
    tar -xzmf "$crate" -C "$packaged" || return 1
    dir=$(basename "$crate" .crate)
    members+=("\"$dir\"")
    patches+=("${dir%-*} = { path = \"$dir\" }")
  done
  {
    echo '[workspace]'
    echo "members = [$(IFS=,; echo "${members[*]}")]"
    echo 'resolver = "3"'
    echo '[patch.crates-io]'
    printf '%s\n' "${patches[@]}"
  } >"$packaged/Cargo.toml"
  cp Cargo.lock "$packaged/"
  (
    cd "$packaged" || exit 1
    export CARGO_TARGET_DIR="$target"
    # Each crate as published, default features.
    without_warnings cargo check --offline --workspace || exit 1
    # The facade's features switch every backend and its TLS on (each alone: the backend crate
    # with only that feature); the backends' own `conformance` features (their test factories
    # for backend authors) are checked together, each crate with that feature only. Checking
    # every crate's every feature alone as well cost CI 6 minutes for no combination these miss.
    without_warnings cargo hack check --offline --no-dev-deps --each-feature -p palisade || exit 1
    without_warnings cargo check --offline -p palisade-core --no-default-features || exit 1
    without_warnings cargo check --offline -p palisade-sqlite -p palisade-postgres -p palisade-dynamodb \
      -p palisade-redis -p palisade-redlock -p palisade-etcd -p palisade-zookeeper --features conformance || exit 1
    for pair in redis,postgres etcd,postgres zookeeper,postgres redis,dynamodb redis-tls,postgres etcd-tls,sqlite zookeeper-tls,postgres zookeeper-sasl,sqlite; do
      without_warnings cargo check --offline -p palisade --no-default-features --features "$pair" || exit 1
    done
  )
}

# Runs a command and fails if the compiler warned: a warning that only some feature set shows
# (an unused variable with every backend off) is a defect, and clippy sees only --all-features.
# Cargo replays a crate's warnings when it is fresh, so a rerun fails the same way.
without_warnings() {
  local log status=0
  log=$(mktemp)
  "$@" 2>&1 | tee "$log" || status=$?
  if grep -qE '^warning: `[^`]+` \([^)]+\) generated [0-9]+ warnings?' "$log"; then
    echo "compiler warnings above, from: $*" >&2
    status=1
  fi
  rm -f "$log"
  return "$status"
}

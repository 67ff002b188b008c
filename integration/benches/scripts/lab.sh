# Sourced by the server-cost scripts (from the repository's root): `lab_up SERVER…` starts the
# project's own loopback servers in a state directory of their own ($state), stops them when
# the script exits, and exports their URLs.
lab_up() {
  state=$(mktemp -d /tmp/palisade-cost.XXXXXX)
  trap 'cargo run -q -p palisade-lab -- down "$state" >/dev/null' EXIT
  cargo run -q -p palisade-lab -- up "$state" "$@" >/dev/null
  # shellcheck source=/dev/null
  source "$state/env"
}

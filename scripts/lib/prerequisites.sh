# Everything the test command needs that a fresh Debian 12 machine with only the Rust toolchain
# lacks, installed before the first step that uses any of it. Sourced by scripts/test and scripts/services.
#
# Debian packages come from Debian's registry through apt-get (root), moto from PyPI into a venv
# of its own with every version pinned (scripts/lib/moto-requirements.txt). Progress is shown:
# a first install takes a few minutes and should not look like a hang.

prereq_log() { printf 'prerequisites: %s\n' "$*" >&2; }

# The newest PostgreSQL major version installed under Debian's layout, or nothing.
svc_postgres_bin() {
  local dir best="" major best_major=0
  for dir in /usr/lib/postgresql/*/bin; do
    [ -x "$dir/postgres" ] || continue
    major=$(basename "$(dirname "$dir")")
    case "$major" in *[!0-9]*) continue ;; esac
    if [ "$major" -gt "$best_major" ]; then best_major=$major best=$dir; fi
  done
  [ -n "$best" ] && echo "$best"
}

# The Debian packages still missing, one name a line.
prereq_missing_packages() {
  command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/descriptor.proto ] ||
    echo "protobuf-compiler libprotobuf-dev" # etcd's client crate compiles its protos at build time
  command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null ||
    echo "python3 python3-venv" # the DynamoDB-API server (moto), and free-port checks
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || echo "redis-server redis-tools"
  svc_postgres_bin >/dev/null || echo "postgresql"
  command -v etcd >/dev/null && command -v etcdctl >/dev/null || echo "etcd-server etcd-client"
  [ -f /usr/share/java/zookeeper.jar ] || echo "zookeeper"
  command -v java >/dev/null || echo "default-jre-headless"
  command -v openssl >/dev/null || echo "openssl" # certificates for the TLS Redis
  command -v setpriv >/dev/null || echo "util-linux" # PostgreSQL refuses to run as root
  command -v ip >/dev/null || echo "iproute2" # network namespaces for the partition tests
  ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || echo "libfaketime" # the torture's clock jumps
  command -v chromium >/dev/null && command -v chromedriver >/dev/null ||
    echo "chromium chromium-driver" # a real browser drives the page of `palisade inspect --serve`
}

# The venv that holds moto, keyed by the requirements file so a new pin makes a new venv.
moto_venv() {
  local req sum
  req="$(dirname "${BASH_SOURCE[0]}")/moto-requirements.txt"
  sum=$(cksum <"$req" | cut -d' ' -f1)
  echo "${PALISADE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/palisade}/moto-$sum"
}

install_prerequisites() {
  local missing
  missing=$(prereq_missing_packages | tr '\n' ' ' | sed 's/ *$//')
  if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
      prereq_log "missing Debian packages: $missing. The test command installs them with apt-get, which needs root and Debian's package registry: run it as root, or install them first."
      return 1
    fi
    prereq_log "installing Debian packages: $missing"
    # shellcheck disable=SC2086 # one word a package
    if ! apt-get update || ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing; then
      prereq_log "apt-get could not install: $missing. The test command needs root and Debian's package registry."
      return 1
    fi
  fi
  local venv req
  venv=$(moto_venv)
  req="$(dirname "${BASH_SOURCE[0]}")/moto-requirements.txt"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import moto.server, flask, flask_cors' 2>/dev/null; then
    prereq_log "installing moto (pinned) from PyPI into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" || ! "$venv/bin/pip" install --progress-bar off -r "$req"; then
      rm -rf "$venv"
      prereq_log "could not install moto into $venv. The test command needs PyPI for the DynamoDB-API test server."
      return 1
    fi
  fi
  export PALISADE_MOTO_PYTHON="$venv/bin/python"
}

# A cargo subcommand, pinned, from crates.io, unless that version is installed already: `NAME
# VERSION WHAT-NEEDS-IT`. The first install builds it (cargo-fuzz and cargo-hack in under a
# minute, cargo-deny in a few); later runs on the same machine find it in ~/.cargo/bin.
install_cargo_tool() {
  local name=$1 version=$2 user=$3
  if "$name" --version 2>/dev/null | grep -qF " $version" ||
    cargo "${name#cargo-}" --version 2>/dev/null | grep -qF " $version"; then
    return 0
  fi
  prereq_log "installing $name $version from crates.io"
  if ! cargo install --quiet --locked "$name" --version "$version"; then
    prereq_log "could not install $name. $user needs crates.io."
    return 1
  fi
}

install_cargo_fuzz() { install_cargo_tool cargo-fuzz 0.13.2 scripts/fuzz; }

# What the test command's packaging and dependency checks run.
install_cargo_checks() {
  install_cargo_tool cargo-hack 0.6.46 "the feature-matrix check" &&
    install_cargo_tool cargo-deny 0.20.2 "the licence and dependency check"
}

# Real servers on loopback for Palisade's tests. Sourced by scripts/test and scripts/services.
#
# Every server binds 127.0.0.1 explicitly, on a free port, with a data directory of its own
# under $PALISADE_SERVICES_DIR. Missing packages are installed (Debian, as root). Each start
# function exports the variable the tests read (PALISADE_REDIS_URL, PALISADE_POSTGRES_URL) and
# records the server's PID in $PALISADE_SERVICES_DIR/pids. The packages they need are installed by
# install_prerequisites (scripts/lib/prerequisites.sh) before any of them runs.

# shellcheck source=scripts/lib/prerequisites.sh
source "$(dirname "${BASH_SOURCE[0]}")/prerequisites.sh"

: "${PALISADE_SERVICES_DIR:=$(mktemp -d /tmp/palisade-services.XXXXXX)}"
export PALISADE_SERVICES_DIR
mkdir -p "$PALISADE_SERVICES_DIR"
# PostgreSQL runs as its own user and must be able to reach its data directory below this one.
chmod 755 "$PALISADE_SERVICES_DIR"

svc_log() { printf 'services: %s\n' "$*" >&2; }

# A free TCP port on 127.0.0.1, chosen below the kernel's ephemeral range when there is room
# (a port from that range may become some outgoing connection's source port before the server
# binds it), then double-checked.
svc_free_port() {
  local port
  for _ in 1 2 3 4 5; do
    port=$(python3 -c '
import random, socket
try:
    first = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except Exception:
    first = 32768
for _ in range(200):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, first) if first >= 11000 else 0))
        print(s.getsockname()[1])
        break
    except OSError:
        pass
    finally:
        s.close()
')
    if [ -n "$port" ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  svc_log "no free port found"
  return 1
}

svc_wait() { # description, tries (x 50 ms), command...
  local what=$1 tries=$2
  shift 2
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  svc_log "$what did not become ready"
  return 1
}

svc_record_pid() { echo "$1 $2" >>"$PALISADE_SERVICES_DIR/pids"; }

# start_redis NAME [extra redis-server args...]: exports PALISADE_REDIS_URL (for NAME=redis).
start_redis() {
  local name=$1
  shift
  local port
  port=$(svc_free_port)
  svc_redis_server "$name" "$port" "redis-cli -p $port ping" --port "$port" "$@"
  if [ "$name" = redis ]; then export PALISADE_REDIS_URL="redis://127.0.0.1:$port"; fi
}

# start_redlock: five independent Redis masters (no persistence, no replication) for the
# Redlock tests. Exports PALISADE_REDLOCK_URL=redlock://127.0.0.1:P1,…,127.0.0.1:P5.
start_redlock() {
  local hosts="" port i
  for i in 1 2 3 4 5; do
    port=$(svc_free_port)
    svc_redis_server "redlock$i" "$port" "redis-cli -p $port ping" --port "$port"
    hosts="${hosts:+$hosts,}127.0.0.1:$port"
  done
  export PALISADE_REDLOCK_URL="redlock://$hosts"
}

# svc_redis_server NAME PORT READY-COMMAND redis-server-args...: starts and waits for readiness.
svc_redis_server() {
  local name=$1 port=$2 ready=$3
  shift 3
  local dir="$PALISADE_SERVICES_DIR/$name"
  mkdir -p "$dir"
  redis-server --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
    --daemonize no --logfile "$dir/redis.log" "$@" </dev/null >/dev/null 2>&1 &
  svc_record_pid "$!" "$name"
  svc_wait "redis ($name)" 100 sh -c "$ready | grep -q PONG"
  echo "$port" >"$dir/port"
  svc_log "$name on 127.0.0.1:$port"
}

# start_postgres: exports PALISADE_POSTGRES_URL.
start_postgres() {
  local bin port dir
  bin=$(svc_postgres_bin) || { svc_log "no PostgreSQL under /usr/lib/postgresql/*/bin"; return 1; }
  # The Rust-side servers (compare --local, tests that start their own) use the same binaries.
  export PALISADE_POSTGRES_BIN="$bin"
  port=$(svc_free_port)
  dir="$PALISADE_SERVICES_DIR/postgres"
  rm -rf "$dir" # a fresh cluster every start: tests own their data
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  # PostgreSQL refuses to run as root.
  setpriv --reuid=postgres --regid=postgres --init-groups "$bin/initdb" -D "$dir/data" -U postgres \
    --auth=trust --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1
  setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" \
    -c listen_addresses=127.0.0.1 -c max_connections=300 </dev/null >"$dir/postgres.log" 2>&1 &
  svc_record_pid "$!" postgres
  svc_wait "postgres" 200 "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"
  svc_log "postgres on 127.0.0.1:$port"
  export PALISADE_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

# stop_services: stops every recorded server by PID (PostgreSQL with SIGINT, a fast shutdown).
stop_services() {
  local pids="$PALISADE_SERVICES_DIR/pids"
  [ -f "$pids" ] || return 0
  while read -r pid name; do
    # A server that already died is fine: `|| true` keeps `set -e` callers going.
    if [ "$name" = postgres ]; then kill -INT "$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
  done <"$pids"
  while read -r pid _; do
    # Our own children are reaped by wait; others are polled until gone.
    wait "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  done <"$pids"
  rm -f "$pids"
  if [ -f "$PALISADE_SERVICES_DIR/cleanup" ]; then
    while read -r dir; do rm -rf "$dir"; done <"$PALISADE_SERVICES_DIR/cleanup"
    rm -f "$PALISADE_SERVICES_DIR/cleanup"
  fi
}

# start_redis_tls: a TLS-only Redis that requires client certificates (mutual TLS), with a
# throwaway CA. Exports PALISADE_REDIS_TLS_URL, PALISADE_REDIS_TLS_CA (the CA certificate, PEM)
# and PALISADE_REDIS_TLS_CLIENT_CERT / _KEY (a client identity that CA signed).
start_redis_tls() {
  local dir="$PALISADE_SERVICES_DIR/redis-tls-certs"
  mkdir -p "$dir"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=palisade test CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" >/dev/null 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$dir/server.key" -out "$dir/server.csr" >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' >"$dir/ext.cnf"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/ext.cnf" -out "$dir/server.crt" >/dev/null 2>&1
  # Extensions make these X.509 v3 certificates: rustls (webpki) refuses v1.
  printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >"$dir/client-ext.cnf"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=palisade test client" \
    -keyout "$dir/client.key" -out "$dir/client.csr" >/dev/null 2>&1
  openssl x509 -req -in "$dir/client.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/client-ext.cnf" -out "$dir/client.crt" >/dev/null 2>&1
  local port
  port=$(svc_free_port)
  svc_redis_server redis-tls "$port" \
    "redis-cli --tls --cacert $dir/ca.crt --cert $dir/client.crt --key $dir/client.key -h 127.0.0.1 -p $port ping" \
    --port 0 --tls-port "$port" --tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" \
    --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients yes
  export PALISADE_REDIS_TLS_URL="rediss://127.0.0.1:$port"
  export PALISADE_REDIS_TLS_CA="$dir/ca.crt"
  export PALISADE_REDIS_TLS_CLIENT_CERT="$dir/client.crt"
  export PALISADE_REDIS_TLS_CLIENT_KEY="$dir/client.key"
}

# start_etcd: a single-member etcd; exports PALISADE_ETCD_URL and PALISADE_ETCD_SERVER (the
# binary, for tests that run clusters of their own).
start_etcd() {
  local port peer dir
  port=$(svc_free_port)
  peer=$(svc_free_port)
  while [ "$peer" = "$port" ]; do peer=$(svc_free_port); done
  dir="$PALISADE_SERVICES_DIR/etcd"
  rm -rf "$dir"
  mkdir -p "$dir"
  # The data lives in memory (/dev/shm when there is one): etcd fsyncs every write, and on a
  # shared test disk that, not Palisade, would set the pace. Durability is not under test here.
  local data=/dev/shm
  [ -d "$data" ] && [ -w "$data" ] || data="$dir"
  data=$(mktemp -d "$data/palisade-etcd.XXXXXX")
  echo "$data" >>"$PALISADE_SERVICES_DIR/cleanup"
  etcd --name n1 --data-dir "$data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "n1=http://127.0.0.1:$peer" --initial-cluster-state new \
    --heartbeat-interval 50 --election-timeout 300 </dev/null >"$dir/etcd.log" 2>&1 &
  svc_record_pid "$!" etcd
  svc_wait "etcd" 200 timeout 3 env ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$port" \
    --command-timeout=2s endpoint health
  echo "$port" >"$dir/port"
  svc_log "etcd on 127.0.0.1:$port"
  export PALISADE_ETCD_URL="etcd://127.0.0.1:$port"
  PALISADE_ETCD_SERVER="$(command -v etcd)"
  export PALISADE_ETCD_SERVER
}

# start_dynamodb: a DynamoDB-API server (moto, from PyPI) on loopback; exports
# PALISADE_DYNAMODB_ENDPOINT and dummy AWS credentials and region for the SDK's standard chain.
start_dynamodb() {
  local python=${PALISADE_MOTO_PYTHON:?install_prerequisites first}
  local port dir
  port=$(svc_free_port)
  dir="$PALISADE_SERVICES_DIR/dynamodb"
  mkdir -p "$dir"
  # One request at a time: see scripts/lib/moto_serial.py for why.
  "$python" "$(dirname "${BASH_SOURCE[0]}")/moto_serial.py" 127.0.0.1 "$port" </dev/null >"$dir/moto.log" 2>&1 &
  svc_record_pid "$!" dynamodb
  svc_wait "dynamodb (moto)" 400 "$python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/', timeout=2)"
  echo "$port" >"$dir/port"
  svc_log "dynamodb (moto) on 127.0.0.1:$port"
  export PALISADE_DYNAMODB_ENDPOINT="http://127.0.0.1:$port"
  # moto accepts any credentials; the SDK's standard chain reads these.
  export AWS_ACCESS_KEY_ID=palisade-test AWS_SECRET_ACCESS_KEY=palisade-test AWS_REGION=us-east-1
}

# start_zookeeper: a standalone ZooKeeper (Debian's package, Java 17) with tickTime 500 ms so
# short sessions are allowed (the minimum is 2 × tickTime); exports PALISADE_ZK_URL and
# PALISADE_ZK_CLASSPATH (for tests that run ensembles of their own).
start_zookeeper() {
  local port dir
  port=$(svc_free_port)
  dir="$PALISADE_SERVICES_DIR/zookeeper"
  rm -rf "$dir"
  mkdir -p "$dir/data"
  cat >"$dir/zoo.cfg" <<CFG
tickTime=500
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
CFG
  export PALISADE_ZK_CLASSPATH=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
  java -Xms32m -Xmx256m -XX:+UseSerialGC -cp "$PALISADE_ZK_CLASSPATH" -Dzookeeper.log.dir="$dir" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" </dev/null >"$dir/zk.log" 2>&1 &
  svc_record_pid "$!" zookeeper
  # timeout: a server that accepted but has not started serving may never answer or close.
  svc_wait "zookeeper" 400 timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && printf ruok >&3 && grep -q imok <&3"
  echo "$port" >"$dir/port"
  svc_log "zookeeper on 127.0.0.1:$port"
  export PALISADE_ZK_URL="zk://127.0.0.1:$port"
}

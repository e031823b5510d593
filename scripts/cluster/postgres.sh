#!/usr/bin/env bash
# A PostgreSQL primary with a synchronous streaming standby, on loopback, of the repository's own: the reference
# topology of docs/DEPLOYMENT.md in miniature, for `make test-cluster` and for trying a failover by hand. Two clusters
# (data directories) of its own, never the machine's shared server.
#
#   scripts/cluster/postgres.sh start            initdb pg1 (first time), start it, make pg2 its standby (pg_basebackup), start it
#   scripts/cluster/postgres.sh stop             stop both (fast shutdown; data kept)
#   scripts/cluster/postgres.sh destroy          stop, then delete the directory
#   scripts/cluster/postgres.sh status           each node: running or not, primary or standby; the primary's replicas
#   scripts/cluster/postgres.sh url [DB]         a multi-host DATABASE_URL that follows the primary (target_session_attrs)
#   scripts/cluster/postgres.sh conninfo [DB]    the same as a libpq conninfo string
#   scripts/cluster/postgres.sh kill-primary     SIGKILL the primary's postmaster and every backend of it (a machine lost)
#   scripts/cluster/postgres.sh promote          promote the standby (pg_ctl promote), then stop waiting for a standby
#   scripts/cluster/postgres.sh failover         kill-primary, then promote (a machine lost and taken over)
#       kill-primary and failover take `--at EPOCH`: the kill waits for that instant (scripts/cluster/at.sh)
#   scripts/cluster/postgres.sh rebuild-standby  make the node that is not primary a fresh standby of the primary
#
# Both nodes carry `synchronous_standby_names = 'ANY 1 (pg1, pg2)'` and `synchronous_commit = on`, each streams under
# its own name as application_name: whichever is primary waits for the other's flush before a commit returns, and
# the names need no edit after a failover. A promoted node has no standby to wait for; `promote` clears the setting
# on it (else every commit would hang) and `rebuild-standby` sets it back once the other node streams again.
#
# Settings (environment): SCHEDULER_CLUSTER_DIR (default ${TMPDIR:-/tmp}/scheduler-cluster; this script uses its
# postgres/ folder), SCHEDULER_CLUSTER_PG_PORT (default 5440: pg1 listens on it + 1, pg2 on it + 2), PG_BIN (the
# server's programs, default /usr/lib/postgresql/15/bin, else pg_config's). As root, everything runs as the postgres
# user (initdb and the server refuse root).
set -euo pipefail
# shellcheck source=scripts/cluster/at.sh
. "$(dirname "$0")/at.sh"

BASE="${SCHEDULER_CLUSTER_DIR:-${TMPDIR:-/tmp}/scheduler-cluster}/postgres"
PORT_BASE="${SCHEDULER_CLUSTER_PG_PORT:-5440}"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
NODES=(1 2)
SYNC_NAMES="ANY 1 (pg1, pg2)"

if [ ! -x "$PG_BIN/initdb" ] && command -v pg_config >/dev/null 2>&1; then
  PG_BIN="$(pg_config --bindir)"
fi
[ -x "$PG_BIN/initdb" ] || { echo "error: no initdb in $PG_BIN (set PG_BIN)" >&2; exit 1; }

RUN_AS=()
if [ "$(id -u)" = 0 ]; then
  RUN_AS=(runuser -u postgres --)
fi

node_dir() { echo "$BASE/pg$1"; }
node_port() { echo $((PORT_BASE + $1)); }
as_pg() { "${RUN_AS[@]}" "$@"; }
pg_ctl() { as_pg "$PG_BIN/pg_ctl" "$@"; }

# A query's one value on node N, or nothing when the node does not answer. Over TCP: the sockets are in $BASE/run.
query() {
  as_pg "$PG_BIN/psql" -X -At -h 127.0.0.1 -p "$(node_port "$1")" -U postgres -d postgres -c "$2" 2>/dev/null
}

running() { pg_ctl -D "$(node_dir "$1")" status >/dev/null 2>&1; }

# Node N's postmaster process exists and is no zombie. Right after kill-primary the killed postmaster lingers as a
# zombie until the machine's init reaps it: pg_ctl then still calls it running, and cannot stop it.
alive() {
  local file pid
  file="$(node_dir "$1")/postmaster.pid"
  [ -s "$file" ] || return 1
  pid="$(head -n 1 "$file")"
  case "$(ps -o stat= -p "$pid" 2>/dev/null)" in
    "" | Z*) return 1 ;;
    *) return 0 ;;
  esac
}

# Stop node N at once, whatever state it is in (a standby about to be replaced, a killed primary's remains).
stop_now() {
  local n=$1
  if alive "$n"; then
    pg_ctl -D "$(node_dir "$n")" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  for _ in $(seq 20); do
    if ! alive "$n"; then
      # A zombie postmaster's pid is still "in use" to the next server's check of the socket lock file: the file is
      # stale (the process is dead), and removing it lets the node start again at once.
      as_pg rm -f "$BASE/run/.s.PGSQL.$(node_port "$n")" "$BASE/run/.s.PGSQL.$(node_port "$n").lock"
      return 0
    fi
    sleep 0.5
  done
  echo "error: pg$n does not stop" >&2
  exit 1
}

# The node now primary (1 or 2): running and not in recovery.
primary() {
  local n
  for n in "${NODES[@]}"; do
    if [ "$(query "$n" 'SELECT pg_is_in_recovery()')" = f ]; then
      echo "$n"
      return 0
    fi
  done
  return 1
}

other() { echo $((3 - $1)); }

# What every node's postgresql.conf adds to initdb's. The port lives in node.conf, which each node writes for itself
# after it has a data directory (pg_basebackup copies the primary's).
common_conf() {
  cat <<EOF

# --- scripts/cluster/postgres.sh ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$BASE/run'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
# A commit returns once the standby has flushed its WAL: a promoted standby holds every acknowledged commit.
synchronous_commit = on
synchronous_standby_names = '$SYNC_NAMES'
# The platform's processes, the tests' and a standby's connections.
max_connections = 200
include_if_exists = 'node.conf'
EOF
}

write_node_conf() {
  local n=$1
  as_pg tee "$(node_dir "$n")/node.conf" >/dev/null <<EOF
port = $(node_port "$n")
cluster_name = 'pg$n'
EOF
}

start_node() {
  local n=$1
  running "$n" && return 0
  echo "PostgreSQL: starting pg$n on 127.0.0.1:$(node_port "$n")"
  pg_ctl -D "$(node_dir "$n")" -l "$BASE/pg$n.log" -w -t 60 start >/dev/null
}

# Node N becomes a standby of node P: a base backup of P's data directory, streaming from P under the name pgN.
make_standby() {
  local n=$1 p=$2 dir
  dir="$(node_dir "$n")"
  echo "PostgreSQL: pg$n becomes a standby of pg$p (pg_basebackup)"
  as_pg rm -rf "$dir"
  # -R writes standby.signal and primary_conninfo; -X stream copies the WAL written meanwhile; -c fast: no wait for
  # a scheduled checkpoint.
  as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$(node_port "$p")" -U postgres -D "$dir" -X stream -c fast -R \
    -d "application_name=pg$n"
  # The name the primary's synchronous_standby_names knows it by, whatever -R took from the connection.
  as_pg tee -a "$dir/postgresql.auto.conf" >/dev/null <<EOF
primary_conninfo = 'host=127.0.0.1 port=$(node_port "$p") user=postgres application_name=pg$n'
EOF
  write_node_conf "$n"
}

# Wait until node P's replication shows node N streaming synchronously (or as a quorum member).
await_sync() {
  local p=$1 n=$2 state
  for _ in $(seq 60); do
    state="$(query "$p" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pg$n'")"
    if [ "$state" = sync ] || [ "$state" = quorum ]; then
      return 0
    fi
    sleep 1
  done
  echo "error: pg$n is not a synchronous standby of pg$p after 60 s" >&2
  exit 1
}

# The node to start as primary when none runs: the one that is no standby; after a failover both are none, and the
# one on the later timeline (the promoted one) holds every acknowledged commit.
choose_primary() {
  local n best="" best_tli=-1 tli
  for n in "${NODES[@]}"; do
    [ -s "$(node_dir "$n")/PG_VERSION" ] && [ ! -e "$(node_dir "$n")/standby.signal" ] || continue
    tli="$(as_pg "$PG_BIN/pg_controldata" "$(node_dir "$n")" | awk -F: '/Latest checkpoint.s TimeLineID/ { gsub(/ /, "", $2); print $2 }')"
    if [ "${tli:-0}" -gt "$best_tli" ]; then
      best=$n
      best_tli=${tli:-0}
    fi
  done
  [ -n "$best" ] && echo "$best"
}

# Node S streams synchronously from primary P: rebuilt from P unless it already is P's standby, started, and P waits
# for it again.
ensure_standby() {
  local p=$1 s=$2
  if ! [ -e "$(node_dir "$s")/standby.signal" ] || ! grep -q "port=$(node_port "$p") " "$(node_dir "$s")/postgresql.auto.conf"; then
    stop_now "$s"
    make_standby "$s" "$p"
    # The copy carries the primary's ALTER SYSTEM (after a promotion: synchronous replication off); the standby keeps
    # postgresql.conf's, which names both nodes, for the day it is promoted.
    as_pg sed -i '/^synchronous_standby_names/d' "$(node_dir "$s")/postgresql.auto.conf"
  fi
  start_node "$s"
  query "$p" "ALTER SYSTEM RESET synchronous_standby_names" >/dev/null
  query "$p" "SELECT pg_reload_conf()" >/dev/null
  await_sync "$p" "$s"
}

cmd_start() {
  local p
  as_pg true # the user exists
  mkdir -p "$BASE"
  [ ${#RUN_AS[@]} -eq 0 ] || chown postgres: "$BASE"
  as_pg mkdir -p "$BASE/run"
  if [ ! -s "$(node_dir 1)/PG_VERSION" ] && [ ! -s "$(node_dir 2)/PG_VERSION" ]; then
    echo "PostgreSQL: initdb pg1"
    # Trust on loopback, as the machine's development server: a test cluster, never a deployment's (DEPLOYMENT.md).
    as_pg "$PG_BIN/initdb" -D "$(node_dir 1)" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
    common_conf | as_pg tee -a "$(node_dir 1)/postgresql.conf" >/dev/null
    write_node_conf 1
  fi
  if ! p="$(primary)"; then
    p="$(choose_primary)" || { echo "error: neither node can start as primary" >&2; exit 1; }
    start_node "$p"
  fi
  ensure_standby "$p" "$(other "$p")"
  cmd_status
}

cmd_stop() {
  local n
  for n in "${NODES[@]}"; do
    if running "$n"; then
      echo "PostgreSQL: stopping pg$n"
      pg_ctl -D "$(node_dir "$n")" -m fast -w stop >/dev/null
    fi
  done
}

cmd_destroy() {
  cmd_stop
  rm -rf "$BASE"
  rmdir "$(dirname "$BASE")" 2>/dev/null || true # the shared parent, once the other cluster is gone too
}

cmd_status() {
  local n role
  for n in "${NODES[@]}"; do
    if running "$n"; then
      case "$(query "$n" 'SELECT pg_is_in_recovery()')" in
        f) role=primary ;;
        t) role=standby ;;
        *) role="not answering" ;;
      esac
    else
      role=down
    fi
    printf 'pg%s  port %-5s %s\n' "$n" "$(node_port "$n")" "$role"
  done
  if p="$(primary)"; then
    echo "replicas of pg$p (application_name, state, sync_state):"
    query "$p" "SELECT application_name, state, sync_state FROM pg_stat_replication" | sed 's/^/  /'
    echo "synchronous_standby_names on pg$p: '$(query "$p" 'SHOW synchronous_standby_names')'"
  fi
}

# connect_timeout: a node that is down refuses at once, but a frozen one would hold each attempt for libpq's default.
cmd_url() {
  local db=${1:-postgres}
  echo "postgres://postgres@127.0.0.1:$(node_port 1),127.0.0.1:$(node_port 2)/$db?target_session_attrs=read-write&connect_timeout=5"
}

cmd_conninfo() {
  local db=${1:-postgres}
  echo "host=127.0.0.1,127.0.0.1 port=$(node_port 1),$(node_port 2) user=postgres dbname=$db target_session_attrs=read-write connect_timeout=5"
}

cmd_kill_primary() {
  local at=${1:-} p pid children
  p="$(primary)" || { echo "error: no primary is running" >&2; exit 1; }
  pid="$(head -n 1 "$(node_dir "$p")/postmaster.pid")"
  sleep_until "$at"
  # The postmaster and its children at the same instant, as a machine's loss: no backend gets to finish a reply.
  # Only this cluster's processes, by pid (the machine's shared server runs the same programs).
  children="$(pgrep -P "$pid" | tr '\n' ' ' || true)"
  # shellcheck disable=SC2086 # the children's pids are words
  kill -KILL "$pid" $children
  echo "PostgreSQL: killed primary pg$p (postmaster $pid and ${children:-no} children)"
}

cmd_promote() {
  local n=""
  for candidate in "${NODES[@]}"; do
    if [ "$(query "$candidate" 'SELECT pg_is_in_recovery()')" = t ]; then
      n=$candidate
    fi
  done
  [ -n "$n" ] || { echo "error: no running standby to promote" >&2; exit 1; }
  pg_ctl -D "$(node_dir "$n")" -w promote >/dev/null
  # Alone, the new primary has no standby to wait for: with the setting kept every commit would wait forever. Commits
  # are asynchronous until rebuild-standby gives it a standby again (DEPLOYMENT.md, "Failover").
  query "$n" "ALTER SYSTEM SET synchronous_standby_names = ''" >/dev/null
  query "$n" "SELECT pg_reload_conf()" >/dev/null
  echo "PostgreSQL: pg$n promoted; it is the primary (synchronous replication off until rebuild-standby)"
}

# What an operator (or pg_auto_failover) does when the primary's machine is lost: the standby takes over at once.
cmd_failover() {
  cmd_kill_primary "${1:-}"
  cmd_promote
}

cmd_rebuild_standby() {
  local p s
  p="$(primary)" || { echo "error: no primary is running" >&2; exit 1; }
  s="$(other "$p")"
  # Whatever the other node holds (a killed primary's divergent WAL, an old standby) is replaced by a fresh copy.
  as_pg rm -f "$(node_dir "$s")/standby.signal"
  ensure_standby "$p" "$s"
  cmd_status
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  destroy) cmd_destroy ;;
  status) cmd_status ;;
  url) cmd_url "${2:-}" ;;
  conninfo) cmd_conninfo "${2:-}" ;;
  kill-primary)
    at="$(option_value --at "$@")" || exit 2
    cmd_kill_primary "$at"
    ;;
  failover)
    at="$(option_value --at "$@")" || exit 2
    cmd_failover "$at"
    ;;
  promote) cmd_promote ;;
  rebuild-standby) cmd_rebuild_standby ;;
  *)
    sed -n '2,26p' "$0" >&2
    exit 2
    ;;
esac

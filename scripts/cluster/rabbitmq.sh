#!/usr/bin/env bash
# A three-node RabbitMQ cluster of the repository's own, on loopback: the reference topology of docs/DEPLOYMENT.md
# in miniature, for `make test-cluster` and for trying a node loss by hand. It never touches the machine's shared
# node: its nodes have names, ports, data directories and an Erlang cookie of their own, and a config file of their
# own (not /etc/rabbitmq's, which names the shared node).
#
#   scripts/cluster/rabbitmq.sh start            start the three nodes (those not running) and join them into one cluster
#   scripts/cluster/rabbitmq.sh stop             stop every node cleanly (data kept: `start` brings the same cluster back)
#   scripts/cluster/rabbitmq.sh destroy          stop, then delete the cluster's directory
#   scripts/cluster/rabbitmq.sh status           each node's state, and the running nodes as the cluster sees them
#   scripts/cluster/rabbitmq.sh urls             the AMQP URLs, `;`-separated (CELERY_BROKER_URL's failover list)
#   scripts/cluster/rabbitmq.sh kill NODE        SIGKILL the node's Erlang VM (a machine lost; NODE is 1, 2, 3 or c1...)
#   scripts/cluster/rabbitmq.sh pause NODE       SIGSTOP it (a partitioned node: alive but silent); `resume NODE` ends it
#   scripts/cluster/rabbitmq.sh rejoin NODE      start a killed node again on its data: it rejoins the cluster by itself
#   scripts/cluster/rabbitmq.sh leader QUEUE     the node leading a quorum queue
#   scripts/cluster/rabbitmq.sh kill-leader QUEUE [--at EPOCH]                 kill the node leading QUEUE (at EPOCH)
#   scripts/cluster/rabbitmq.sh pause-leader QUEUE [--at EPOCH] [--for SECONDS]  pause it (and resume it SECONDS later)
#   scripts/cluster/rabbitmq.sh ctl NODE ARGS..  rabbitmqctl against that node, with the cluster's cookie
#
# Settings (environment): SCHEDULER_CLUSTER_DIR (default ${TMPDIR:-/tmp}/scheduler-cluster; this script uses its
# rabbitmq/ folder), SCHEDULER_CLUSTER_RABBIT_PORT (default 5680: node N listens on it + N, its Erlang distribution
# on it + 20000 + N), SCHEDULER_CLUSTER_RABBIT_HOST (the short host name in the node names, default localhost),
# RABBITMQ_BIN (the folder of the real rabbitmq-server and rabbitmqctl, default Debian's /usr/lib/rabbitmq/bin;
# /usr/sbin's wrappers switch to the rabbitmq user through `su`, which resets HOME and with it the cookie).
set -euo pipefail
# shellcheck source=scripts/cluster/at.sh
. "$(dirname "$0")/at.sh"

BASE="${SCHEDULER_CLUSTER_DIR:-${TMPDIR:-/tmp}/scheduler-cluster}/rabbitmq"
PORT_BASE="${SCHEDULER_CLUSTER_RABBIT_PORT:-5680}"
HOST="${SCHEDULER_CLUSTER_RABBIT_HOST:-localhost}"
RABBITMQ_BIN="${RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}"
NODES=(1 2 3)
START_SECONDS=90

if [ ! -x "$RABBITMQ_BIN/rabbitmq-server" ]; then
  # Not Debian's layout: the commands on PATH are the real ones (a generic-unix or Homebrew install).
  RABBITMQ_BIN="$(dirname "$(command -v rabbitmq-server || echo /nonexistent/rabbitmq-server)")"
fi
[ -x "$RABBITMQ_BIN/rabbitmq-server" ] || { echo "error: rabbitmq-server is not installed here" >&2; exit 1; }

# As root the nodes run as the rabbitmq user, as the machine's own node does (the server refuses nothing as root, but
# its files would then belong to root and the packaged tools could not read them).
RUN_AS=()
if [ "$(id -u)" = 0 ] && id -u rabbitmq >/dev/null 2>&1; then
  RUN_AS=(runuser -u rabbitmq --)
fi

node_name() { echo "sched-c$1@$HOST"; }
node_dir() { echo "$BASE/c$1"; }
node_port() { echo $((PORT_BASE + $1)); }

# NODE given as 1, c1, sched-c1 or sched-c1@host.
node_index() {
  local arg="${1:-}"
  arg="${arg%%@*}"
  arg="${arg#sched-}"
  arg="${arg#c}"
  case "$arg" in
    1 | 2 | 3) echo "$arg" ;;
    *) echo "error: unknown node '${1:-}' (1, 2 or 3)" >&2; exit 2 ;;
  esac
}

# The environment of node N for the server and for the CLI tools. HOME is the cluster's directory: both read the
# Erlang cookie from $HOME/.erlang.cookie, so the three nodes and rabbitmqctl share a cookie no other node has.
node_env() {
  local n=$1 dir
  dir="$(node_dir "$n")"
  echo "HOME=$BASE"
  echo "RABBITMQ_NODENAME=$(node_name "$n")"
  echo "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1"
  echo "RABBITMQ_NODE_PORT=$(node_port "$n")"
  echo "RABBITMQ_DIST_PORT=$((PORT_BASE + 20000 + n))"
  echo "RABBITMQ_MNESIA_BASE=$dir/mnesia"
  echo "RABBITMQ_LOG_BASE=$dir/log"
  echo "RABBITMQ_PID_FILE=$dir/pid"
  echo "RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins"
  echo "RABBITMQ_CONFIG_FILE=$dir/rabbitmq"
  echo "RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config"
  echo "RABBITMQ_CONF_ENV_FILE=$dir/env.conf"
}

# Run a command as the nodes' user with node N's environment.
with_node() {
  local n=$1
  shift
  local -a assignments
  mapfile -t assignments < <(node_env "$n")
  "${RUN_AS[@]}" env "${assignments[@]}" "$@"
}

ctl() {
  local n=$1
  shift
  with_node "$n" "$RABBITMQ_BIN/rabbitmqctl" -q -n "$(node_name "$n")" "$@"
}

node_pid() {
  local file
  file="$(node_dir "$1")/pid"
  [ -s "$file" ] && cat "$file"
}

# The node's VM is alive (its pid file names a live process: a quick answer for a node that is down, where a ping
# would wait seconds) and answers a ping.
running() {
  local pid
  pid="$(node_pid "$1" || true)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ctl "$1" ping >/dev/null 2>&1
}

prepare() {
  local n dir
  mkdir -p "$BASE"
  if [ ! -s "$BASE/.erlang.cookie" ]; then
    # A random cookie of the cluster's own: no other Erlang node on the machine can talk to these nodes.
    od -An -N20 -tx1 /dev/urandom | tr -d ' \n' >"$BASE/.erlang.cookie"
  fi
  chmod 400 "$BASE/.erlang.cookie"
  for n in "${NODES[@]}"; do
    dir="$(node_dir "$n")"
    mkdir -p "$dir/mnesia" "$dir/log"
    # No plugins: the management listener (15672) would collide with the shared node's and between our nodes.
    echo "[]." >"$dir/enabled_plugins"
    : >"$dir/env.conf"
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$(node_port "$n")
loopback_users = none
# A node that sees fewer than half of the cluster pauses itself: a partitioned minority never accepts a publish it
# could not replicate, and quorum queues confirm only what a majority holds anyway.
cluster_partition_handling = pause_minority
EOF
  done
  if [ ${#RUN_AS[@]} -gt 0 ]; then
    chown -R rabbitmq: "$BASE"
  fi
}

start_node() {
  local n=$1 dir
  dir="$(node_dir "$n")"
  if running "$n"; then
    return 0
  fi
  echo "RabbitMQ: starting $(node_name "$n") on 127.0.0.1:$(node_port "$n")"
  # setsid: the node outlives this script and is not in the caller's process group (a Ctrl-C of make stops the make,
  # not the node; `stop` does that).
  setsid bash "$0" _serve "$n" >"$dir/server.out" 2>&1 </dev/null &
}

# start_node's background half: the node's server, in place of this shell (exec). A shell left waiting on the server
# would, once the node dies (a kill), read on in this file at the offset where it stopped: in a file edited since,
# that is the middle of some other command, which it would then run.
serve() {
  local -a assignments
  mapfile -t assignments < <(node_env "$1")
  exec "${RUN_AS[@]}" env "${assignments[@]}" "$RABBITMQ_BIN/rabbitmq-server"
}

await_node() {
  local n=$1 deadline=$((SECONDS + START_SECONDS))
  # await_startup fails at once while the VM has not registered its name yet: ask again until the deadline.
  until ctl "$n" await_startup --timeout 10 >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: $(node_name "$n") did not start within ${START_SECONDS}s; its output:" >&2
      tail -n 40 "$(node_dir "$n")/server.out" >&2 || true
      exit 1
    fi
    sleep 1
  done
}

# One list of node N's cluster status, one node per line: running_nodes (the nodes it runs with now) or disk_nodes
# (its cluster's members, running or not, as its own database records them). Fails when the node does not answer.
# Callers keep the list in a variable and test it with `lists`, never `status_nodes … | grep -q`: grep -q leaves at its
# first match, and under PYTHONUNBUFFERED=1 (the tests' environment) print's closing newline is a second write that
# then fails (EPIPE), so under pipefail such a test said "not listed" for 10-30 % of the calls about any node but the
# last of the list. That made `join` reset live members (docs/DEPLOYMENT.md's split node).
status_nodes() {
  local status
  status="$(ctl "$1" cluster_status --formatter json)" || return 1
  python3 -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])[sys.argv[2]]))' "$status" "$2"
}

running_nodes() { status_nodes "$1" running_nodes; }

# Whether the node list LIST (lines, as status_nodes gives) names node N.
lists() {
  case $'\n'"$1"$'\n' in
    *$'\n'"$(node_name "$2")"$'\n'*) return 0 ;;
    *) return 1 ;;
  esac
}

# join_steps N COMMAND… [-- COMMAND…]…: run the commands of a join of node N in turn, each only once the one before
# succeeded (set -e does not apply inside an `if` or a `||` list): a start_app after a failed join_cluster would start
# the reset node as a new cluster of its own, serving clients alone. The CLI logs the node's warnings of a join
# (feature flags, tracking tables) on stderr: kept in join.log, shown when a step fails.
join_steps() {
  local n=$1 log
  shift
  log="$(node_dir "$n")/join.log"
  local -a step=()
  while [ $# -gt 0 ]; do
    step=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do step+=("$1"); shift; done
    [ $# -gt 0 ] && shift # the --
    if ! "${step[@]}" >>"$log" 2>&1; then
      tail -n 20 "$log" >&2
      echo "error: '${step[*]}' failed: $(node_name "$n") is not in the cluster (its app is left as that step left it)" >&2
      exit 1
    fi
  done
}

join() {
  local n=$1 own seed
  # Node 1 is the seed the others join; it joins no one (a node 1 that came back alone is await_whole's to report).
  [ "$n" = 1 ] && return 0
  # The node's own database decides, never a failed or missing answer of node 1's: a node restarted on its data
  # lists the cluster and is a member; resetting it would wipe its queues' replicas, and, if join_cluster then failed
  # (node 1 down or busy), leave it a cluster of its own. Only a node whose database holds nobody but itself (fresh,
  # or reset) joins.
  own="$(status_nodes "$n" disk_nodes)" || { echo "error: $(node_name "$n") does not answer cluster_status" >&2; exit 1; }
  [ "$own" = "$(node_name "$n")" ] || return 0
  seed="$(status_nodes 1 disk_nodes)" || {
    echo "error: $(node_name "$n") has to join the cluster, but $(node_name 1) does not answer: try again once it runs" >&2
    exit 1
  }
  if lists "$seed" "$n"; then
    # The cluster still counts it as a member whose database is gone (a lost disk): join_cluster would answer
    # "already a member" and leave it alone. The cluster forgets it first, as docs/DEPLOYMENT.md's runbook says.
    echo "RabbitMQ: $(node_name "$n") lost its database: $(node_name 1) forgets it before it joins again"
    join_steps "$n" ctl "$n" stop_app -- ctl 1 forget_cluster_node "$(node_name "$n")"
  fi
  echo "RabbitMQ: joining $(node_name "$n") to $(node_name 1)"
  # stop_app, reset (a fresh node's own, empty database gives way to the cluster's), join_cluster, start_app.
  join_steps "$n" ctl "$n" stop_app -- ctl "$n" reset -- ctl "$n" join_cluster "$(node_name 1)" -- ctl "$n" start_app
  if lists "$seed" "$n"; then
    # Its quorum queue members went with the forget: give it one in every quorum queue again.
    with_node "$n" "$RABBITMQ_BIN/rabbitmq-queues" -q -n "$(node_name "$n")" grow "$(node_name "$n")" all \
      >>"$(node_dir "$n")/join.log" 2>&1 || echo "warning: rabbitmq-queues grow failed (join.log)" >&2
  fi
}

cmd_start() {
  local n
  prepare
  # All at once: a stopped cluster's nodes wait for each other at boot (each for the last one that stopped).
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do await_node "$n"; done
  for n in 2 3; do join "$n"; done
  cmd_status
}

cmd_stop() {
  local n pid
  for n in "${NODES[@]}"; do
    if running "$n"; then
      echo "RabbitMQ: stopping $(node_name "$n")"
      # With the pid file, stop waits until the VM has exited.
      ctl "$n" stop "$(node_dir "$n")/pid" >/dev/null || true
    fi
    # A node paused with SIGSTOP answers no ping and cannot stop itself: resume it and let it go.
    pid="$(node_pid "$n" || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
}

cmd_destroy() {
  cmd_stop
  rm -rf "$BASE"
  rmdir "$(dirname "$BASE")" 2>/dev/null || true # the shared parent, once the other cluster is gone too
}

cmd_status() {
  local n seen="" state pid
  for n in "${NODES[@]}"; do
    pid="$(node_pid "$n" || true)"
    if running "$n"; then
      state=running
      [ -n "$seen" ] || seen=$n
    elif [ -n "$pid" ] && [ "$(ps -o state= -p "$pid" 2>/dev/null)" = T ]; then
      state=paused
    else
      state=down
    fi
    printf '%-24s port %-5s pid %-8s %s\n' "$(node_name "$n")" "$(node_port "$n")" "${pid:--}" "$state"
  done
  if [ -n "$seen" ]; then
    echo "running in the cluster (as $(node_name "$seen") sees it): $(running_nodes "$seen" | tr '\n' ' ')"
  fi
}

cmd_urls() {
  local n urls=()
  for n in "${NODES[@]}"; do urls+=("amqp://guest:guest@127.0.0.1:$(node_port "$n")//"); done
  (IFS=';'; echo "${urls[*]}")
}

cmd_kill() {
  local n pid
  n="$(node_index "${1:-}")"
  pid="$(node_pid "$n" || true)"
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "error: $(node_name "$n") is not running" >&2
    exit 1
  fi
  # The VM only, as a machine's loss would: no clean shutdown, no goodbye to the other nodes.
  kill -KILL "$pid"
  rm -f "$(node_dir "$n")/pid"
  echo "RabbitMQ: killed $(node_name "$n") (pid $pid)"
}

cmd_signal() {
  local signal=$1 n pid
  n="$(node_index "${2:-}")"
  pid="$(node_pid "$n" || true)"
  [ -n "$pid" ] || { echo "error: $(node_name "$n") has no pid file" >&2; exit 1; }
  kill "-$signal" "$pid"
  echo "RabbitMQ: $signal sent to $(node_name "$n") (pid $pid)"
}

cmd_rejoin() {
  local n
  n="$(node_index "${1:-}")"
  prepare
  start_node "$n"
  await_node "$n"
  # Its database remembers the cluster: it comes back as a member; a node that was reset or lost its disk is joined.
  join "$n"
  await_whole "$n"
  cmd_status
}

# Node N and every other running node see each other as running: a node that came back as a cluster of its own
# (docs/DEPLOYMENT.md; `join` made them out of live members until it trusted the node's own database) fails here,
# loudly, instead of serving alone.
await_whole() {
  local n=$1 other deadline=$((SECONDS + 60)) whole mine theirs
  while :; do
    whole=yes
    mine="$(running_nodes "$n" || true)"
    for other in "${NODES[@]}"; do
      [ "$other" = "$n" ] && continue
      running "$other" || continue
      theirs="$(running_nodes "$other" || true)"
      if ! lists "$theirs" "$n" || ! lists "$mine" "$other"; then
        whole=no
      fi
    done
    [ "$whole" = yes ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: $(node_name "$n") and the cluster do not see each other as running after 60 s:" >&2
      for other in "${NODES[@]}"; do
        if running "$other"; then
          echo "  as $(node_name "$other") sees it: running $(running_nodes "$other" | tr '\n' ' ')," \
            "members $(status_nodes "$other" disk_nodes | tr '\n' ' ')" >&2
        fi
      done
      exit 1
    fi
    sleep 1
  done
}

# kill-leader QUEUE [--at EPOCH]: find the node leading QUEUE now (rabbitmqctl: a second or two), then SIGKILL it at
# EPOCH (bench burst --fault passes $T0: the node goes while the burst is in flight).
cmd_kill_leader() {
  local queue=${1:?queue name} at=${2:-} leader
  leader="$(cmd_leader "$queue")"
  [ -n "$leader" ] || { echo "error: no queue '$queue' (or it has no leader)" >&2; exit 1; }
  sleep_until "$at"
  cmd_kill "$leader"
}

# pause-leader QUEUE [--at EPOCH] [--for SECONDS]: SIGSTOP the node leading QUEUE at EPOCH (a partitioned node: alive,
# its connections open, silent); with --for, SIGCONT it that many seconds later.
cmd_pause_leader() {
  local queue=${1:?queue name} at=${2:-} hold=${3:-} leader
  leader="$(cmd_leader "$queue")"
  [ -n "$leader" ] || { echo "error: no queue '$queue' (or it has no leader)" >&2; exit 1; }
  sleep_until "$at"
  cmd_signal STOP "$leader"
  if [ -n "$hold" ]; then
    sleep "$hold"
    cmd_signal CONT "$leader"
  fi
}

cmd_leader() {
  local queue=${1:?queue name} n
  for n in "${NODES[@]}"; do
    if running "$n"; then
      ctl "$n" list_queues name leader --no-table-headers | awk -v q="$queue" '$1 == q { print $2 }'
      return 0
    fi
  done
  echo "error: no node is running" >&2
  exit 1
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  destroy) cmd_destroy ;;
  status) cmd_status ;;
  urls) cmd_urls ;;
  kill) cmd_kill "${2:-}" ;;
  pause) cmd_signal STOP "${2:-}" ;;
  resume) cmd_signal CONT "${2:-}" ;;
  rejoin) cmd_rejoin "${2:-}" ;;
  leader) cmd_leader "${2:-}" ;;
  kill-leader)
    at="$(option_value --at "$@")" || exit 2
    cmd_kill_leader "${2:-}" "$at"
    ;;
  pause-leader)
    at="$(option_value --at "$@")" || exit 2
    hold="$(option_value --for "$@")" || exit 2
    cmd_pause_leader "${2:-}" "$at" "$hold"
    ;;
  _serve) serve "$(node_index "${2:-}")" ;; # start_node's background half
  ctl)
    shift
    n="$(node_index "${1:-}")"
    shift
    ctl "$n" "$@"
    ;;
  *)
    sed -n '2,24p' "$0" >&2
    exit 2
    ;;
esac; exit # on the same line: bash has read it before it runs the command, and reads no further in a file edited since

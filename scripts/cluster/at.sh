# Sourced by the cluster scripts: `--at EPOCH` on a fault command (a kill, a failover) defers its blow until that
# instant (seconds since the epoch, fractions allowed), after everything slow (finding the leader or the primary)
# is done. `bench burst --fault` starts its command before the burst instant with T0 in its environment, so a node is
# lost while the burst is in flight, not a rabbitmqctl start-up later (dispatch/bench/faults.py).

# sleep_until EPOCH: return at that instant (at once when it is past or empty).
sleep_until() {
  local at=${1:-} delay
  [ -n "$at" ] || return 0
  delay="$(awk -v at="$at" -v now="$(date +%s.%N)" 'BEGIN { d = at - now; printf "%.3f", (d > 0 ? d : 0) }')"
  sleep "$delay"
}

# option_value NAME ARGS...: the value given to option NAME (`--at`, `--for`) among the arguments, or nothing; a
# value that is not a number (an unset $T0 expands to nothing) fails, so a fault never strikes at the wrong time. Call
# it in an assignment of its own (`at="$(option_value --at "$@")" || exit 2`): inside a command's arguments its
# failure would be ignored.
option_value() {
  local name=$1
  shift
  while [ $# -gt 0 ]; do
    if [ "$1" = "$name" ]; then
      if ! [[ "${2:-}" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
        echo "error: $name needs a number of seconds, not '${2:-}'" >&2
        return 2
      fi
      echo "$2"
      return 0
    fi
    shift
  done
}

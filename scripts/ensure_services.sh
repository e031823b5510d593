#!/usr/bin/env bash
# Makes sure PostgreSQL and RabbitMQ answer on 127.0.0.1; starts an installed but stopped server, or says
# exactly what is missing. Used by `make demo` and by CI.
set -euo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for_port() {
  local port=$1 name=$2 seconds=$3
  for _ in $(seq "$seconds"); do
    port_open "$port" && return 0
    sleep 1
  done
  echo "error: $name did not start listening on 127.0.0.1:$port within ${seconds}s" >&2
  return 1
}

if port_open 5432; then
  echo "PostgreSQL: up on 127.0.0.1:5432"
elif command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  echo "PostgreSQL: starting cluster $version/main"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  wait_for_port 5432 PostgreSQL 60
else
  echo "error: PostgreSQL is not running on 127.0.0.1:5432 and is not installed here." >&2
  echo "       Install PostgreSQL 15 (Debian: apt-get install postgresql) or set DATABASE_URL." >&2
  exit 1
fi

if port_open 5672; then
  echo "RabbitMQ: up on 127.0.0.1:5672"
elif command -v rabbitmq-server >/dev/null 2>&1; then
  echo "RabbitMQ: starting"
  rabbitmq-server -detached
  wait_for_port 5672 RabbitMQ 90
else
  echo "error: RabbitMQ is not running on 127.0.0.1:5672 and is not installed here." >&2
  echo "       Install it (Debian: apt-get install rabbitmq-server) or set CELERY_BROKER_URL." >&2
  exit 1
fi

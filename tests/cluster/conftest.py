"""The clusters the tests in this folder run against: three RabbitMQ nodes and a PostgreSQL primary with a synchronous
standby, started by scripts/cluster/ (`make test-cluster` starts them, runs these tests and stops them).

Every test here is marked `cluster`, which `make test` and `make test-long` deselect; run by hand on a machine whose
clusters are not up, the fixtures skip. These tests never touch the machine's shared PostgreSQL or RabbitMQ.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "cluster"
RABBIT_PORT_BASE = int(os.environ.get("SCHEDULER_CLUSTER_RABBIT_PORT", "5680"))
PG_PORT_BASE = int(os.environ.get("SCHEDULER_CLUSTER_PG_PORT", "5440"))
RABBIT_NODES = (1, 2, 3)
PG_NODES = (1, 2)


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def script(name: str, *args: str, timeout: float = 180) -> str:
    """Run scripts/cluster/<name> with `args`; its output, or a failure that shows it."""
    done = subprocess.run(
        ["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if done.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    return done.stdout


def measured(what: str, **numbers: object) -> None:
    """One measurement as a JSON line on stdout (`make test-cluster` shows the passed tests' output)."""
    print(json.dumps({"measured": what, **numbers}), flush=True)


@dataclass(frozen=True)
class RabbitCluster:
    """The three nodes of scripts/cluster/rabbitmq.sh."""

    def port(self, node: int) -> int:
        return RABBIT_PORT_BASE + node

    def url(self, node: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port(node)}//"

    @property
    def urls(self) -> str:
        """Every node, `;`-separated: kombu's failover syntax, which the relay takes too."""
        return ";".join(self.url(node) for node in RABBIT_NODES)

    def name(self, node: int) -> str:
        return f"sched-c{node}@localhost"

    def node_of(self, name: str) -> int:
        return int(name.split("@")[0].removeprefix("sched-c"))

    def ctl(self, node: int, *args: str, timeout: float = 60) -> str:
        return script("rabbitmq.sh", "ctl", str(node), *args, timeout=timeout)

    def ctl_json(self, node: int, *args: str) -> object:
        return json.loads(self.ctl(node, *args, "--formatter", "json"))

    def running_nodes(self, seen_from: int) -> list[str]:
        status = self.ctl_json(seen_from, "cluster_status")
        assert isinstance(status, dict)
        return sorted(status["running_nodes"])

    def queue(self, seen_from: int, name: str) -> dict:
        """The queue's row of list_queues: type, leader, members, online."""
        rows = self.ctl_json(seen_from, "list_queues", "name", "type", "leader", "members", "online")
        assert isinstance(rows, list)
        return next(row for row in rows if row["name"] == name)

    def assert_whole(self) -> None:
        """Every node sees all three running: a loss measured on a split cluster would be the split's doing."""
        everyone = sorted(self.name(node) for node in RABBIT_NODES)
        for node in RABBIT_NODES:
            assert self.running_nodes(node) == everyone, f"the cluster is not whole as node {node} sees it"

    def pid(self, node: int) -> int | None:
        """The node's VM process, from its pid file (None when it is down or was killed)."""
        path = Path(os.environ.get("SCHEDULER_CLUSTER_DIR", f"{os.environ.get('TMPDIR', '/tmp')}/scheduler-cluster"))
        try:
            return int((path / "rabbitmq" / f"c{node}" / "pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self, node: int) -> bool:
        """The node's VM runs and answers (a killed node's port is closed)."""
        return port_open(self.port(node))

    def declare_quorum(self, queue: str, node: int = 1) -> None:
        """A durable quorum queue, declared through `node`."""
        from kombu import Connection

        with Connection(self.url(node)) as conn:
            conn.default_channel.queue_declare(
                queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
            )

    def is_whole(self) -> bool:
        """assert_whole as a question (a node still pausing or rejoining: not yet)."""
        try:
            self.assert_whole()
        except AssertionError:
            return False
        return True

    def resume(self, node: int) -> None:
        """SIGCONT to a paused node (nothing happens to a running one; a node that is down is left so)."""
        if self.pid(node) is not None:
            script("rabbitmq.sh", "resume", str(node))

    def kill(self, node: int) -> None:
        script("rabbitmq.sh", "kill", str(node))

    def rejoin(self, node: int) -> None:
        script("rabbitmq.sh", "rejoin", str(node), timeout=300)


@dataclass(frozen=True)
class PostgresCluster:
    """The two nodes of scripts/cluster/postgres.sh: which one is primary changes with a failover."""

    def port(self, node: int) -> int:
        return PG_PORT_BASE + node

    def conninfo(self, dbname: str = "postgres") -> str:
        """Both nodes, the primary chosen by libpq (target_session_attrs=read-write)."""
        return script("postgres.sh", "conninfo", dbname).strip()

    def url(self, dbname: str = "postgres") -> str:
        return script("postgres.sh", "url", dbname).strip()

    def node_conninfo(self, node: int, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port(node)} user=postgres dbname={dbname} connect_timeout=5"

    def status(self) -> str:
        return script("postgres.sh", "status")

    def primary(self) -> int:
        """The node that is primary now."""
        import psycopg

        for node in PG_NODES:
            try:
                with psycopg.connect(self.node_conninfo(node), autocommit=True) as conn:
                    if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:  # type: ignore[index]
                        return node
            except psycopg.OperationalError:
                continue
        raise AssertionError(f"no primary: {self.status()}")

    def kill_primary(self) -> None:
        script("postgres.sh", "kill-primary")

    def promote(self) -> None:
        script("postgres.sh", "promote")

    def rebuild_standby(self) -> None:
        script("postgres.sh", "rebuild-standby", timeout=300)


@pytest.fixture(scope="session")
def rabbit_cluster() -> RabbitCluster:
    if not all(port_open(RABBIT_PORT_BASE + node) for node in RABBIT_NODES):
        pytest.skip("the RabbitMQ cluster is not running (make test-cluster starts it: scripts/cluster/rabbitmq.sh)")
    return RabbitCluster()


@pytest.fixture(scope="session")
def pg_cluster() -> PostgresCluster:
    if not any(port_open(PG_PORT_BASE + node) for node in PG_NODES):
        pytest.skip("the PostgreSQL cluster is not running (make test-cluster starts it: scripts/cluster/postgres.sh)")
    return PostgresCluster()


def wait_until(check, seconds: float, what: str, every: float = 0.5):
    """Poll `check` until it returns something true; that value. Fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        time.sleep(every)

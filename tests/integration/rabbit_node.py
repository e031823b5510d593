"""A RabbitMQ node of the test's own: its own node name, ports and data directory, so a test can raise a memory
alarm or set a policy without touching the node every other test (and engineer) on the machine uses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

START_SECONDS = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class RabbitNode:
    name: str
    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def ctl(self, *args: str, timeout: float = 30) -> str:
        """`rabbitmqctl -n <this node> <args>`; raises on failure."""
        done = subprocess.run(
            ["rabbitmqctl", "-q", "-n", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stdout} {done.stderr}")
        return done.stdout

    def raise_memory_alarm(self) -> None:
        self.ctl("set_vm_memory_high_watermark", "0.000001")

    def clear_memory_alarm(self) -> None:
        self.ctl("set_vm_memory_high_watermark", "0.4")


@contextmanager
def rabbit_node() -> Iterator[RabbitNode]:
    """Start a node in a temporary directory, wait until it serves, stop it and remove its data at the end."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmq-server is not installed here: no private node can be started")
    base = Path(tempfile.mkdtemp(prefix="rabbit-node-"))
    name = f"test{uuid.uuid4().hex[:8]}@localhost"
    port, dist_port = _free_port(), _free_port()
    for sub in ("mnesia", "log"):
        (base / sub).mkdir()
    (base / "enabled_plugins").write_text("")  # no management listener to collide with the shared node's
    (base / "env.conf").write_text("")  # not the machine's rabbitmq-env.conf (it names the shared node)
    (base / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n")
    # rabbitmq-server drops to the rabbitmq user when started as root: the directory must be its own.
    if os.geteuid() == 0:
        shutil.chown(base, "rabbitmq")
        for path in base.rglob("*"):
            shutil.chown(path, "rabbitmq")
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
        "RABBITMQ_CONF_ENV_FILE": str(base / "env.conf"),
    }
    log = (base / "server.out").open("w")
    server = subprocess.Popen(["rabbitmq-server"], env=env, stdout=log, stderr=subprocess.STDOUT)
    node = RabbitNode(name, port, env)
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            waited = subprocess.run(
                ["rabbitmqctl", "-q", "-n", name, "await_startup", "--timeout", "10"],
                env=env,
                capture_output=True,
                timeout=30,
            )
            if waited.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the private RabbitMQ node did not start: {(base / 'server.out').read_text()}")
            time.sleep(0.5)
        yield node
    finally:
        subprocess.run(["rabbitmqctl", "-q", "-n", name, "stop"], env=env, capture_output=True, timeout=60)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)

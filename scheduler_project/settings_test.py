"""Settings for the test suite: the real services, but queues of their own so tests never touch real work."""

import os

os.environ.setdefault("SCHEDULER_STRICT_QUEUE", "test.scheduler.strict")
os.environ.setdefault("SCHEDULER_FLEXIBLE_QUEUE", "test.scheduler.flexible")
# Under pytest-xdist each worker has its own test database (pytest-django names it) and, here, its own queues: the
# worker's name is appended to the names it inherited from the controller. The processes a test starts inherit them.
# Once per worker: a test's process (which inherits the marker) may name queues of its own on top of these.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER and os.environ.get("SCHEDULER_TEST_QUEUES_OF") != _WORKER:
    for _lane in ("SCHEDULER_STRICT_QUEUE", "SCHEDULER_FLEXIBLE_QUEUE"):
        os.environ[_lane] = f"{os.environ[_lane]}.{_WORKER}"
    os.environ["SCHEDULER_TEST_QUEUES_OF"] = _WORKER
# The webhook tests' receivers listen on loopback; the refusal of private targets has tests of its own.
os.environ.setdefault("SCHEDULER_WEBHOOK_ALLOW_PRIVATE", "1")

from scheduler_project.settings import *  # noqa: E402, F403  (the environment above comes first)

# Fast hashing: tests create users, and the default hasher's deliberate slowness buys nothing here.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

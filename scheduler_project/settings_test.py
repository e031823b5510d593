"""Settings for the test suite: the real services, but queues of their own so tests never touch real work."""

import os

os.environ.setdefault("SCHEDULER_STRICT_QUEUE", "test.scheduler.strict")
os.environ.setdefault("SCHEDULER_FLEXIBLE_QUEUE", "test.scheduler.flexible")
# The webhook tests' receivers listen on loopback; the refusal of private targets has tests of its own.
os.environ.setdefault("SCHEDULER_WEBHOOK_ALLOW_PRIVATE", "1")

from scheduler_project.settings import *  # noqa: F403

# Fast hashing: tests create users, and the default hasher's deliberate slowness buys nothing here.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

"""Running the product's real processes against the test database, as an operator's supervisor would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.db import connection

from scheduler_project.database_url import database_url

ROOT = Path(__file__).resolve().parents[2]


def process_env(**overrides: str) -> dict[str, str]:
    """The environment of a process that uses this test run's database (and queues, inherited)."""
    params = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings_test",
        "DATABASE_URL": database_url(params),
        "SCHEDULER_LOG_LEVEL": "INFO",
        **overrides,
    }


def manage(*args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """`manage.py <args>` as a child process."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env or process_env(), cwd=ROOT, **popen
    )


def run_manage(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`manage.py <args>` to completion, output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env or process_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )

"""What every benchmark needs to run the product's real processes: where the project is, the database they must
use, their peak memory, and the one JSON line a benchmark ends with."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from django.db import connection

from scheduler_project.database_url import database_url as scheduler_database_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]


_PR_SET_PDEATHSIG = 1  # prctl(2)


def start_child(command: list[str], **popen: Any) -> subprocess.Popen:
    """Start one of a benchmark's processes so that it cannot outlive the benchmark: the kernel sends it SIGTERM
    when the benchmark dies, even by SIGKILL. A relay or worker left behind would go on consuming and publishing
    on the next run's queues and database (which reuse its names), and count as that run's duplicates."""
    parent = os.getpid()

    def die_with_parent() -> None:  # runs in the child between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the benchmark died before the request took effect
            os._exit(1)

    return subprocess.Popen(command, cwd=PROJECT_ROOT, preexec_fn=die_with_parent, **popen)


def rss_peak_mb(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of a live process, in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def children_rss_peak_mb(pid: int) -> float | None:
    """Peak RSS of a process and its children (a management command may fork); the largest one."""
    peaks = [rss_peak_mb(pid)]
    try:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            peaks.append(rss_peak_mb(int(child)))
    except OSError:
        pass
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def database_url() -> str:
    """This process's database as a DATABASE_URL, so the processes a benchmark starts use the same one."""
    return scheduler_database_url(connection.settings_dict)


def result_line(result: dict[str, Any]) -> str:
    """The last line of a benchmark's output: one JSON object."""
    return json.dumps(result, default=str, sort_keys=False)

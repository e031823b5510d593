"""Start-up refuses a deployment's insecure configuration; a developer's machine needs no configuration at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_settings(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SCHEDULER_HTTPS"))}
    return subprocess.run(
        [sys.executable, "-c", "import scheduler_project.settings as s; print(s.SECRET_KEY[:8], s.DEBUG)"],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_without_any_configuration_a_development_key_is_used():
    loaded = load_settings()
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[0] == "dev-only"


def test_debug_off_without_a_secret_key_stops_start_up_with_a_clear_message():
    loaded = load_settings(DJANGO_DEBUG="0")
    assert loaded.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in loaded.stderr


def test_debug_off_with_the_committed_development_key_stops_start_up():
    loaded = load_settings(
        DJANGO_DEBUG="0", DJANGO_SECRET_KEY="dev-only-insecure-key-change-me-in-production-0123456789"
    )
    assert loaded.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in loaded.stderr


def test_debug_off_with_a_real_key_starts():
    loaded = load_settings(DJANGO_DEBUG="0", DJANGO_SECRET_KEY="a-real-secret-of-this-deployment-" + "x" * 30)
    assert loaded.returncode == 0, loaded.stderr


def test_https_mode_passes_the_deployment_security_checks():
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")},
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "a-real-secret-of-this-deployment-" + "x" * 40,
        "SCHEDULER_HTTPS": "1",
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
    }
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--tag", "security", "--fail-level", "WARNING"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""`manage.py check --deploy` with the settings of a deployment behind TLS (docs/API.md, "Configuration"): clean
when the secrets are its own, and it names what is missing otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[2]
TLS_DEPLOYMENT = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "a-deployment-secret-key-" + "x" * 40,
    "SCHEDULER_HTTPS": "1",
}


def check_deploy(**env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SCHEDULER_"))}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
        env={**environment, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_tls_deployment_with_its_own_keys_passes_check_deploy_without_a_warning():
    result = check_deploy(**TLS_DEPLOYMENT, SCHEDULER_ENCRYPTION_KEYS=Fernet.generate_key().decode())

    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_without_encryption_keys_check_deploy_names_the_missing_setting():
    result = check_deploy(**TLS_DEPLOYMENT)

    assert result.returncode != 0 and "scheduler.W001" in result.stderr and "SCHEDULER_ENCRYPTION_KEYS" in result.stderr


def test_a_malformed_encryption_key_stops_start_up_naming_the_setting():
    result = check_deploy(**TLS_DEPLOYMENT, SCHEDULER_ENCRYPTION_KEYS="not-a-key")

    assert result.returncode != 0 and "SCHEDULER_ENCRYPTION_KEYS" in result.stderr and "Traceback" not in result.stderr

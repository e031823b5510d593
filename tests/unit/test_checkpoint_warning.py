"""When /healthz says the server's WAL budget is small for the load (dispatch/upkeep.py checkpoint_warning)."""

from __future__ import annotations

from dispatch.upkeep import CHECKPOINT_WARNING_AFTER, checkpoint_warning


def test_no_warning_while_the_clock_decides_most_checkpoints():
    assert checkpoint_warning(timed=500, requested=499, max_wal_size="1GB") is None
    assert checkpoint_warning(timed=0, requested=CHECKPOINT_WARNING_AFTER - 1, max_wal_size="1GB") is None


def test_a_warning_naming_the_budget_once_volume_forces_most_of_them():
    warning = checkpoint_warning(timed=40, requested=160, max_wal_size="1GB")

    assert warning is not None
    assert warning.startswith("160 of the PostgreSQL server's 200 checkpoints were forced by WAL volume")
    assert "max_wal_size (1GB)" in warning and "docs/SCALING.md" in warning

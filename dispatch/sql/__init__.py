"""Every hot statement of the data plane, one module per concern: materialize, outbox, claims, leases, maintenance.

Names are unique across the modules, so a statement is found by name with one grep.
"""

from __future__ import annotations

# PostgreSQL's clock: the one every node agrees on (ARCHITECTURE rule 1).
DB_NOW = "SELECT clock_timestamp()"

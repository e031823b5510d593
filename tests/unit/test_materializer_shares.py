"""A batch's share of each leased shard, and when a scan short of its limit may still have left due cursors behind."""

from __future__ import annotations

from dispatch.engine.materializer import MIN_SHARD_SHARE, SHARD_COLUMN, batch_was_full, shard_share


def rows_of(shards: list[int]) -> list[tuple]:
    """Scan rows holding each given shard in the shard column (the other columns do not matter here)."""
    rows = []
    for shard in shards:
        row: list[object] = [None] * 4
        row[SHARD_COLUMN] = shard
        rows.append(tuple(row))
    return rows


def test_a_batch_takes_an_equal_share_of_every_leased_shard():
    assert shard_share(20_000, 256) == 79, "every shard hands the batch the same run of tenants"
    assert shard_share(20_000, 1) == 20_000
    assert shard_share(2, 256) == MIN_SHARD_SHARE


def test_a_scan_cut_short_by_one_shards_share_is_full_though_short_of_its_limit():
    assert batch_was_full(rows_of([1, 2, 3]), limit=3, per_shard=16), "the batch's limit"
    assert not batch_was_full(rows_of([1, 2, 2]), limit=10, per_shard=3), "every shard gave all it had"
    assert batch_was_full(rows_of([1, 2, 2, 2]), limit=10, per_shard=3), "shard 2 may have more due"


def test_the_test_rows_carry_their_shard_where_the_materializer_reads_it():
    assert [row[SHARD_COLUMN] for row in rows_of([7, 9])] == [7, 9]

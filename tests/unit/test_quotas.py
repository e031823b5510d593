"""Weighted fair shares of a relay batch (dispatch/quotas.py): proportional to weight, never more than a tenant has
due, and what one leaves unused goes to the others."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatch.quotas import Demand, fair_shares, virtual_finish


def test_a_small_tenant_gets_all_it_has_due_and_the_big_one_the_rest():
    shares = fair_shares({1: Demand(2000, 1), 2: Demand(10, 1)}, 500)
    assert shares == {1: 490, 2: 10}


def test_weights_divide_the_batch_when_both_want_more_than_it_holds():
    shares = fair_shares({1: Demand(5000, 3), 2: Demand(5000, 1)}, 400)
    assert shares == {1: 300, 2: 100}


def test_more_tenants_than_the_batch_holds_take_turns_one_envelope_each():
    demands = {tenant: Demand(5, 1) for tenant in range(10)}
    first = fair_shares(demands, 4, rotation=0)
    second = fair_shares(demands, 4, rotation=4)
    assert first == {0: 1, 1: 1, 2: 1, 3: 1}
    assert second == {4: 1, 5: 1, 6: 1, 7: 1}


def test_nothing_due_or_no_room_gives_nothing():
    assert fair_shares({1: Demand(0, 1)}, 10) == {}
    assert fair_shares({1: Demand(3, 1)}, 0) == {}


def test_fair_queueing_tags_interleave_tenants_by_weight():
    # Tenant A (weight 2) and B (weight 1), envelopes of 100 fires: A's second envelope ties with B's first.
    tags = sorted(
        [("A", virtual_finish(100 * n, 2)) for n in range(1, 5)] + [("B", virtual_finish(100 * n, 1)) for n in (1, 2)],
        key=lambda tag: tag[1],
    )
    assert [tenant for tenant, _ in tags] == ["A", "A", "B", "A", "A", "B"]


@given(
    st.dictionaries(st.integers(1, 50), st.tuples(st.integers(0, 3000), st.integers(1, 10)), min_size=1, max_size=20),
    st.integers(1, 1000),
)
def test_shares_never_exceed_what_is_due_and_fill_the_batch_when_enough_is_due(raw, capacity):
    demands = {tenant: Demand(envelopes, weight) for tenant, (envelopes, weight) in raw.items()}
    shares = fair_shares(demands, capacity)
    wanting = [tenant for tenant, d in demands.items() if d.envelopes > 0]
    assert all(0 < shares[tenant] <= demands[tenant].envelopes for tenant in shares)
    assert set(shares) <= set(wanting)
    if len(wanting) <= capacity:
        assert set(shares) == set(wanting), "every tenant with work due gets some of the batch"
        total_due = sum(demands[t].envelopes for t in wanting)
        # Rounding down the last split leaves at most one envelope per tenant unused; it never overfills the batch.
        assert min(capacity, total_due) - len(wanting) <= sum(shares.values()) <= capacity

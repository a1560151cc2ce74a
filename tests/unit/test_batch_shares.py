"""The Python engine's share of a limited batch among partitions (python_engine.reader.prorated): Spark's rule
for ``maxOffsetsPerTrigger``, so both engines cut a catch-up into the same batches."""
from hypothesis import given
from hypothesis import strategies as st

from python_engine.reader import prorated


def test_a_limit_the_lags_fit_in_sets_no_bound():
    assert prorated({0: 10, 1: 0}, {0: 20, 1: 5}, 15) is None
    assert prorated({0: 10, 1: 0}, {0: 20, 1: 5}, 100) is None


def test_each_partition_gets_its_lags_share_rounded_down():
    # Lags 300, 200, 100 and a limit of 60: 30, 20, 10 from each partition's own start.
    assert prorated({0: 0, 1: 50, 2: 7}, {0: 300, 1: 250, 2: 107}, 60) == {0: 30, 1: 70, 2: 17}
    assert prorated({0: 0, 1: 0}, {0: 100, 1: 100}, 7) == {0: 3, 1: 3}


def test_a_partition_with_a_small_lag_is_not_starved():
    # Its share (1000 * 1 / 100001 < 1) rounds up to one offset, as Spark's does.
    assert prorated({0: 0, 1: 0}, {0: 100_000, 1: 1}, 1000) == {0: 999, 1: 1}


def test_a_partition_without_lag_reads_nothing():
    assert prorated({0: 5, 1: 0}, {0: 5, 1: 100}, 10) == {0: 5, 1: 10}


@given(st.dictionaries(st.integers(0, 11), st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)), min_size=1),
       st.integers(1, 10**6))
def test_shares_stay_inside_the_lags_and_add_up_to_about_the_limit(lags, limit):
    starts = {p: start for p, (start, _) in lags.items()}
    ends = {p: start + lag for p, (start, lag) in lags.items()}
    shares = prorated(starts, ends, limit)
    if sum(lag for _, lag in lags.values()) <= limit:
        assert shares is None
        return
    assert set(shares) == set(starts)
    for p in starts:
        assert starts[p] <= shares[p] <= ends[p]
        assert (shares[p] > starts[p]) == (ends[p] > starts[p])  # every partition with a lag moves
    taken = sum(shares[p] - starts[p] for p in starts)
    assert limit - len(starts) <= taken <= limit + len(starts)

"""projection_core.positions' comparisons (the log's ends themselves are read from the broker:
tests/integration/test_positions.py)."""
from projection_core.positions import behind, lag


def test_a_position_past_the_last_record_is_caught_up_and_not_ahead():
    ends = {0: 7312, 1: 40}  # the offset after each partition's last record; a commit marker at 7312 and 40
    assert lag({0: 7312, 1: 41}, ends) == 0  # one batch ended at the record, one past the marker
    assert lag({0: 7300, 1: 41}, ends) == 12  # partition by partition: 41 on p1 does not make up for p0
    assert behind({0: 7312, 1: 40}, {0: 7313, 1: 41}, ends) == {}  # only markers between
    assert behind({0: 7312, 1: 40}, {0: 7313, 1: 41}) == {0: 7313, 1: 41}  # offsets as they are (no broker)
    assert behind({0: 7311}, {0: 7313}, ends) == {0: 7313}  # a record the archive has not reached

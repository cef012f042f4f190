"""lookahead.sequences.agreeing_prefix: the one count of leading tokens two sequences share."""
import numpy as np

from lookahead.sequences import agreeing_prefix


def test_agreeing_prefix_stops_at_the_first_difference():
    assert agreeing_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert agreeing_prefix([5, 6], [7, 6]) == 0


def test_agreeing_prefix_of_a_sequence_and_its_extension_is_the_shorter_length():
    assert agreeing_prefix([1, 2], [1, 2, 3]) == 2
    assert agreeing_prefix([1, 2, 3], [1, 2]) == 2
    assert agreeing_prefix([], [1]) == 0 and agreeing_prefix([], []) == 0


def test_agreeing_prefix_compares_lists_with_numpy_arrays():
    assert agreeing_prefix([3, 4, 5], np.array([3, 4, 6], dtype=np.int32)) == 2
    assert agreeing_prefix(np.array([3, 4], dtype=np.int64), np.array([3, 4, 5], dtype=np.intc)) == 2

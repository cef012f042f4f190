"""How far two token sequences agree: the one definition the drafter, the simulator and the
KV-cache reuse all count with."""
from __future__ import annotations

from typing import Sequence


def agreeing_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share: the index of their first difference, or the
    shorter one's length. Lists and numpy arrays alike."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

"""How likely a candidate's tokens are to be accepted: per-request Beta posteriors by
(candidate kind, match-length bucket), starting from the prior tables."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import priors  # read at call time: a test may install its own tables there


def _counts() -> np.ndarray:
    return np.zeros((priors.N_KINDS, len(priors._BUCKET_UPPER)))


@dataclass
class AcceptanceModel:
    """Per-token acceptance estimates by (candidate kind, match-length bucket): Beta posteriors."""

    accepted: np.ndarray = field(default_factory=_counts)
    rejected: np.ndarray = field(default_factory=_counts)
    sampled: bool = False  # temperature > 0: the target sometimes picks another token than a copy

    def _prior(self) -> np.ndarray:
        return np.asarray(priors._PRIOR_MEAN_SAMPLED if self.sampled else priors._PRIOR_MEAN)  # [kinds, buckets]

    def rates(self, kind: int, match_lengths: np.ndarray) -> np.ndarray:
        """Posterior mean per-token acceptance for candidate tokens at these match lengths.

        `kind`: CONTEXT_KIND or REFERENCE_KIND (a bool: from a reference or not).
        """
        kind = int(kind)
        strength = priors._PRIOR_STRENGTH
        a0 = self._prior()[kind] * strength
        means = (self.accepted[kind] + a0) / (self.accepted[kind] + self.rejected[kind] + strength)
        upper = priors._BUCKET_UPPER
        buckets = np.searchsorted(upper, match_lengths)  # first upper bound >= length
        return means[np.minimum(buckets, len(upper) - 1)]

    def rate(self, kind: int, match_length: int) -> float:
        """`rates` for one match length, without numpy (called at every step)."""
        b = priors._bucket(match_length)
        kind = int(kind)
        acc, rej = self.accepted[kind, b], self.rejected[kind, b]
        prior = (priors._PRIOR_MEAN_SAMPLED if self.sampled else priors._PRIOR_MEAN)[kind][b]
        strength = priors._PRIOR_STRENGTH
        return float((acc + prior * strength) / (acc + rej + strength))

    def update(self, kind: int, match_length: int, drafted: int, accepted: int) -> None:
        """A candidate of `drafted` tokens had its first `accepted` confirmed by the target.

        Tokens after the first rejection were never tested, so they are not evidence.
        """
        kind = int(kind)
        for i in range(accepted):
            self.accepted[kind, priors._bucket(match_length + i)] += 1
        if accepted < drafted:
            self.rejected[kind, priors._bucket(match_length + accepted)] += 1

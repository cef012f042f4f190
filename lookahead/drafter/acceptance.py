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
    # candidate tokens after a sentence's end (see priors._PRIOR_BOUNDARY): accepted, rejected
    boundary_accepted: float = 0.0
    boundary_rejected: float = 0.0

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

    def boundary_rate(self) -> float:
        """Posterior mean acceptance of a candidate token that follows a sentence's end."""
        prior = priors._PRIOR_BOUNDARY_SAMPLED if self.sampled else priors._PRIOR_BOUNDARY
        strength = priors._BOUNDARY_STRENGTH
        return float((self.boundary_accepted + prior * strength)
                     / (self.boundary_accepted + self.boundary_rejected + strength))

    def update_boundaries(self, after_boundary: list[bool], accepted: int, tested: int) -> None:
        """Of candidate tokens tested in order, the first `accepted` were confirmed (then one
        was refuted, if `accepted` < `tested`); `after_boundary[i]`: token i follows a
        sentence's end."""
        for i in range(min(tested, len(after_boundary))):
            if after_boundary[i]:
                if i < accepted:
                    self.boundary_accepted += 1
                else:
                    self.boundary_rejected += 1
            if i >= accepted:
                break

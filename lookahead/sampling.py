"""The target distribution: exactly what llama-cpp-python 0.3.36's plain path samples from.

`Llama._init_sampler` builds this llama.cpp sampler chain (vendor/llama.cpp/src/llama-sampler.cpp):

    penalties -> temp < 0:  dist                                  (full softmax)
                 temp == 0: greedy                                (argmax)
                 else:      top_k -> typical -> top_p -> min_p -> temp -> dist   (min_keep = 1)

What each step does, as read in the C++ (all arithmetic is float32, like llama.cpp's):
* llama_sampler_penalties_apply: off when penalty_last_n == 0 (negative is clamped to 0) or
  repeat == 1 and freq == 0 and present == 0. For every token with count c >= 1 in the ring
  buffer of the last penalty_last_n *accepted* tokens: logit *= repeat if logit <= 0 else
  logit /= repeat; then logit -= c * freq + present. `generate` makes a fresh sampler per call
  and only `llama_sampler_sample` calls accept, so the window holds generated tokens only,
  never the prompt.
* llama_sampler_greedy_apply: first index with the largest logit (strict `>`) == np.argmax.
* llama_sampler_top_k_impl: k <= 0 is off; k = min(k, size); keeps the k largest logits, sorted
  descending.
* llama_sampler_typical_apply: off when p >= 1. Softmax of the survivors, entropy H, sorts by
  |-log p_i - H| ascending and keeps tokens until the running sum is > p (strict), the token
  that crosses included. Leaves them in that order. (If a probability underflows to 0, C++ gets
  a NaN entropy and an unspecified order; here 0 log 0 = 0.)
* llama_sampler_top_p_apply: off when p >= 1. Softmax of the *survivors* (after top_k, at
  temperature 1, i.e. before temp), summed in their current order; then, by descending logit,
  keeps tokens until the running sum is >= p, the crossing token included. p = 0 keeps one.
  If the sum never reaches p (rounding) it keeps all. Unsorted sets > 1024 try the top 256
  first; that is only a speed-up (here: heads of 256, 2048, ... of the tokens min_p keeps).
* llama_sampler_min_p_apply: off when p <= 0. Compares logits, not probabilities: keeps
  logit >= max_logit + logf(p) (so p_i >= p * p_max, at temperature 1, before temp).
* llama_sampler_temp_impl: logit /= temp (skipped when temp == 1). A temp that rounds to 0.0f
  keeps only the first largest logit.
* llama_sampler_dist_apply: softmax with expf(logit - max) in float and the sum in double,
  then inverse-CDF sampling. The order of the survivors does not change the distribution.

Where this can still differ from llama.cpp (checked against the real chain in the tests):
* exactly tied logits at a cutoff (top_k, top_p, typical): C++ keeps an unspecified one of
  them (std::partial_sort / std::sort); here the lower token id, or the earlier position;
* numpy's float32 exp may round differently from libm's expf by an ulp, which matters only
  when a running sum lands within float32 rounding of top_p / typical_p.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

_F32 = np.float32
_TOP_P_FIRST_TRY = 256  # llama_sampler_top_p_apply also looks at the top 256 first
_TOP_K_STRIDE = 16  # top-k looks at every 16th logit first (see _largest)


@dataclass(frozen=True)
class SamplingParams:
    """The sampling settings of one llama-cpp-python request (same names, same defaults).

    Its defaults are the only place sampling defaults are written: `LIBRARY_DEFAULTS` (the
    Python API's, llama-cpp-python's) and `FRONT_END_DEFAULTS` (the commands' and the server's)
    are made from them.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64

    def __post_init__(self) -> None:
        for name in ("temperature", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("top_p", "min_p", "typical_p"):
            value = getattr(self, name)
            if not _is_real(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not _is_real(self.repeat_penalty) or not 0.0 < self.repeat_penalty < math.inf:
            raise ValueError(
                f"repeat_penalty must be a finite number > 0, got {self.repeat_penalty!r}")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer (<= 0 means no top-k), got {self.top_k!r}")
        if not _is_int(self.penalty_last_n):  # <= 0: penalties off, as llama.cpp clamps it to 0
            raise ValueError(f"penalty_last_n must be an integer (<= 0 means no penalties), "
                             f"got {self.penalty_last_n!r}")

    @property
    def greedy(self) -> bool:
        """temperature == 0: llama-cpp-python uses the greedy sampler (argmax)."""
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        """False when llama.cpp's penalties sampler is a no-op (compared as float32, like C)."""
        return self.penalty_last_n > 0 and not (
            _F32(self.repeat_penalty) == 1.0
            and _F32(self.frequency_penalty) == 0.0
            and _F32(self.presence_penalty) == 0.0
        )


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


LIBRARY_DEFAULTS = SamplingParams()  # `Lookahead.create_completion`'s, as `Llama.create_completion`'s
# `lookahead generate`/`rewrite` and `lookahead serve`: greedy unless asked, the rest as the library's
FRONT_END_DEFAULTS = SamplingParams(temperature=0.0)


def recent_window(tokens: Sequence[int], params: SamplingParams) -> tuple:
    """The last penalty_last_n generated tokens: what the penalties sampler has seen."""
    if not params.uses_penalties:
        return ()
    return tuple(int(t) for t in tokens[-params.penalty_last_n:])


def apply_penalties(logits, recent_tokens, params: SamplingParams) -> np.ndarray:
    """Repeat/frequency/presence penalties (llama_sampler_penalties_apply); a new float32 array."""
    penalised = np.array(logits, dtype=_F32)  # [n_vocab], a copy
    if penalised.ndim != 1:
        raise ValueError(f"logits must be one row [n_vocab], got shape {penalised.shape}")
    window = list(recent_tokens)[-params.penalty_last_n:] if params.penalty_last_n > 0 else []
    if not params.uses_penalties or not window:
        return penalised
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    if ids[0] < 0 or ids[-1] >= penalised.size:
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise ValueError(f"recent token {bad} is outside the vocabulary [0, {penalised.size})")
    repeat = _F32(params.repeat_penalty)
    seen = penalised[ids]
    seen = np.where(seen <= 0, seen * repeat, seen / repeat)
    seen -= counts.astype(_F32) * _F32(params.frequency_penalty) + _F32(params.presence_penalty)
    penalised[ids] = seen
    return penalised


def target_probs(logits, params: SamplingParams, recent_tokens=()) -> tuple[np.ndarray, np.ndarray]:
    """(token_ids [m], probs [m] float64 summing to 1): the support the plain path samples from."""
    row = _penalised(logits, params, recent_tokens)  # [n_vocab] float32
    if params.greedy:
        return np.array([int(np.argmax(row))]), np.ones(1)
    if params.temperature < 0:
        return np.arange(row.size), _softmax64(row)
    ids = _top_k(row, params.top_k)  # [k] token ids, by descending logit
    kept = row[ids]
    ids, kept = _typical(ids, kept, params.typical_p)
    ids, kept = _top_p(ids, kept, params.top_p, params.min_p)
    ids, kept = _min_p(ids, kept, params.min_p)
    temp = _F32(params.temperature)
    if temp <= 0:  # a tiny temperature that rounds to 0.0f: llama_sampler_temp_impl keeps the max
        return ids[[int(np.argmax(kept))]], np.ones(1)
    if temp != 1:
        kept = kept / temp
    return ids, _softmax64(kept)


def sample_token(logits, params: SamplingParams, rng: np.random.Generator, recent_tokens=()) -> int:
    """One token as the plain path would draw it; greedy is a plain argmax (no rng, no softmax)."""
    if params.greedy:
        return int(np.argmax(_penalised(logits, params, recent_tokens)))
    token_ids, probs = target_probs(logits, params, recent_tokens)
    return draw_token(token_ids, probs, rng)


def draw_token(token_ids: np.ndarray, probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw of token_ids[i] with probability probs[i] (probs need not be normalised)."""
    cumulative = np.cumsum(probs)  # [m]
    i = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(token_ids[min(i, len(token_ids) - 1)])


def _penalised(logits, params: SamplingParams, recent_tokens) -> np.ndarray:
    if params.uses_penalties and len(recent_tokens) > 0:
        return apply_penalties(logits, recent_tokens, params)
    row = np.asarray(logits, dtype=_F32)  # no copy for float32 input
    if row.ndim != 1:
        raise ValueError(f"logits must be one row [n_vocab], got shape {row.shape}")
    return row


def _softmax64(logits32: np.ndarray) -> np.ndarray:
    """llama_sampler_dist_apply: p = expf(logit - max) in float32, normalised in float64."""
    e = np.exp(logits32 - logits32.max()).astype(np.float64)
    return e / e.sum()


def _softmax32(logits32: np.ndarray) -> np.ndarray:
    """llama_sampler_softmax_impl: float32, summed sequentially in the current order."""
    e = np.exp(logits32 - logits32.max())
    return e / np.cumsum(e)[-1]


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, by descending value; ties: lower position first."""
    n = values.size
    if k >= n:
        return np.argsort(-values, kind="stable")
    if _TOP_K_STRIDE * k < n:  # so that the sample holds more than k values
        # Fast path: the k largest of every 16th value are k values of the whole, so at least
        # k values reach the sample's k-th largest, and the k largest of the whole all do. The
        # exact selection below then runs on those alone: some hundreds of a model's 150k
        # logits, peaked or flat. Where ties make them more than a quarter of the values, the
        # full partition below is the cheaper one.
        sample = values[::_TOP_K_STRIDE]
        threshold = np.partition(sample, sample.size - k)[sample.size - k]
        candidates = np.flatnonzero(values >= threshold)
        if k <= candidates.size <= n // 4:
            return candidates[_largest(values[candidates], k)]
    kth = np.partition(values, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(values > kth)
    at = np.flatnonzero(values == kth)[: k - above.size]
    positions = np.concatenate([above, at])
    return positions[np.argsort(-values[positions], kind="stable")]


def _top_k(row: np.ndarray, top_k: int) -> np.ndarray:
    """llama_sampler_top_k_impl: ids of the top_k largest logits, sorted; all ids if top_k <= 0."""
    if top_k <= 0:
        return np.arange(row.size)  # unsorted, token-id order
    return _largest(row, top_k)


def _typical(ids, kept, typical_p: float):
    """llama_sampler_typical_apply (locally typical sampling)."""
    if typical_p >= 1.0:
        return ids, kept
    order = np.argsort(-kept, kind="stable")  # softmax_impl(cur_p, do_sort=true)
    ids, kept = ids[order], kept[order]
    probs = _softmax32(kept)
    with np.errstate(divide="ignore", invalid="ignore"):
        neg_log = -np.log(probs)
        plogp = np.where(probs > 0, probs * neg_log, _F32(0))
    entropy = np.cumsum(plogp)[-1]
    order = np.argsort(np.abs(neg_log - entropy), kind="stable")
    n_keep = _first_reaching(np.cumsum(probs[order]), _F32(typical_p), strict=True)
    order = order[:n_keep]
    return ids[order], kept[order]


def _top_p(ids, kept, top_p: float, min_p: float):
    """llama_sampler_top_p_apply: the smallest prefix, by descending logit, with mass >= top_p.

    min_p (next in the chain) also keeps a prefix of that order, with the same max, so only its
    survivors need sorting; among them, heads of 256, 2048, ... are tried (llama.cpp also tries
    256 first). The result is the same as a full sort.
    """
    if top_p >= 1.0:
        return ids, kept
    probs = _softmax32(kept)  # over all survivors, summed in their current order, like llama.cpp
    n_candidates = kept.size  # how many min_p will keep
    if min_p > 0.0:
        n_candidates = int(np.count_nonzero(kept >= _min_logit(kept, min_p)))
    size = min(_TOP_P_FIRST_TRY, n_candidates)
    while True:
        head = _largest(kept, size)  # positions, by descending logit
        cumulative = np.cumsum(probs[head])
        if cumulative[-1] >= _F32(top_p) or size == n_candidates:
            break
        size = min(size * 8, n_candidates)
    head = head[: _first_reaching(cumulative, _F32(top_p), strict=False)]
    return ids[head], kept[head]


def _first_reaching(cumulative: np.ndarray, p, strict: bool) -> int:
    """How many to keep: through the first running sum >= p (> p if strict); else all."""
    reached = cumulative > p if strict else cumulative >= p
    return int(np.argmax(reached)) + 1 if reached.any() else cumulative.size


def _min_p(ids, kept, min_p: float):
    """llama_sampler_min_p_apply: keep logit >= max_logit + logf(min_p)."""
    if min_p <= 0.0:
        return ids, kept
    survive = kept >= _min_logit(kept, min_p)  # the max always survives (min_p <= 1)
    return ids[survive], kept[survive]


def _min_logit(kept: np.ndarray, min_p: float):
    return kept.max() + np.log(_F32(min_p))  # float32: p_i >= min_p * p_max

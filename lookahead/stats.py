"""One stats object per request: what was drafted, what the target accepted, where time went."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

# The counters, summed when requests are merged, and the times in ms, rounded in `to_dict`.
COUNT_FIELDS = ("prompt_tokens", "reused_prompt_tokens", "generated_tokens", "target_passes", "draft_passes",
                "tree_passes", "drafted", "accepted", "prediction_drafted", "prediction_accepted", "first_pass_tokens")
MS_FIELDS = ("prefill_ms", "first_token_ms", "index_ms", "propose_ms", "verify_ms", "sample_ms", "calibration_ms",
             "total_ms", "request_ms")
# The times a merge sums. index_ms is not among them, so a rewrite's merged stats report 0.0 for
# it, as they always have; summing it too would change what the server returns for an edit.
# first_token_ms is not summed either: the merged request's first token is its first part's.
_MERGED_MS_FIELDS = tuple(key for key in MS_FIELDS if key not in ("index_ms", "first_token_ms"))


@dataclass
class SpeculationStats:
    speculative: bool = True
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens whose KV entries were kept from the last request
    generated_tokens: int = 0
    target_passes: int = 0  # decodes after the prefill, one per step
    draft_passes: int = 0  # steps that verified a non-empty draft
    tree_passes: int = 0  # of those, drafts that branched (several continuations in one decode)
    drafted: int = 0  # draft tokens sent to the target
    accepted: int = 0  # draft tokens the verifier accepted
    accept_histogram: dict[int, int] = field(default_factory=dict)  # accepted per drafted step -> steps
    # Per index source (0: the running context, 1..: references in registration order):
    # [drafted, accepted] of the drafts it backed (it holds the drafted tokens; a draft backed
    # by several sources counts for each).
    by_source: dict[int, list[int]] = field(default_factory=dict)
    # The request's `prediction` reference (OpenAI's Predicted Outputs): its drafted / accepted.
    prediction_drafted: int = 0
    prediction_accepted: int = 0
    # The prompt's prefill: the cached-prefix lookup, the decode of all but its last chunk, and
    # the first pass, which decodes that chunk (with the first draft, if any).
    prefill_ms: float = 0.0
    first_pass_tokens: int = 0  # tokens the first pass emitted (their time is in prefill_ms)
    first_token_ms: float = 0.0  # from the engine's start to the first token (prefill, one-off timings)
    index_ms: float = 0.0  # tokenizing and indexing the references, and indexing the prompt
    propose_ms: float = 0.0  # index queries + drafting decisions
    verify_ms: float = 0.0  # target decodes of [last token + draft]
    sample_ms: float = 0.0  # verifier: sampling / acceptance on the logits rows
    calibration_ms: float = 0.0  # one-off timings: decode threads, verify-cost curve (first request)
    decode_threads: int | None = None  # threads of one-token decodes (llama.cpp) at the request's end
    # Decodes ran far slower than the cost curve (another process on the cores): the backend
    # was asked to relieve it (llama.cpp: fewer threads) for the rest of the request.
    contended: bool = False
    total_ms: float = 0.0  # the engine's time: from the prefill to the last token
    # The library's whole time for the request: total_ms plus the chat template, tokenizing and
    # building the text and chunks; a stream counts only the time spent making its chunks, not
    # the time its consumer holds them (so a server's own cost is its client's time minus this).
    request_ms: float = 0.0
    fallback: str | None = None  # why speculation was not used, when it was not
    exact: bool | None = None  # the backend's batched rows equal its one-token rows (None: it does not say)
    exact_reason: str = ""  # when not exact: why

    def record_step(self, drafted: int, accepted: int, emitted: int, source: int = 0,
                    sources: Iterable[int] = ()) -> None:
        self.target_passes += 1
        self.generated_tokens += emitted
        if drafted:
            self.draft_passes += 1
            self.drafted += drafted
            self.accepted += accepted
            self.accept_histogram[accepted] = self.accept_histogram.get(accepted, 0) + 1
            for sid in dict.fromkeys(map(int, sources)) if sources else (int(source),):
                counts = self.by_source.setdefault(sid, [0, 0])
                counts[0] += drafted
                counts[1] += accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def decode_ms(self) -> float:
        """The engine's time after the prefill, one-off timings left out."""
        return max(0.0, self.total_ms - self.prefill_ms - self.calibration_ms)

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted after the first pass (whose time is the prefill's)."""
        return max(0, self.generated_tokens - self.first_pass_tokens)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first pass over the time after it."""
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["accept_histogram"] = {str(k): v for k, v in sorted(self.accept_histogram.items())}
        out["by_source"] = {str(k): list(v) for k, v in sorted(self.by_source.items())}
        out["acceptance_rate"] = round(self.acceptance_rate, 4)
        out["tokens_per_pass"] = round(self.tokens_per_pass, 4)
        out["tokens_per_second"] = round(self.tokens_per_second, 2)
        for key in MS_FIELDS:
            out[key] = round(out[key], 3)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SpeculationStats":
        """The stats that `to_dict` gave `d` (a request's `speculation`). Keys it does not know,
        such as the derived rates, are ignored; missing ones take their defaults, except that a
        dict that does not say it was speculative was not."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["speculative"] = bool(d.get("speculative", False))
        for key in COUNT_FIELDS:
            if key in known:
                known[key] = int(known[key])
        for key in MS_FIELDS:
            if key in known:
                known[key] = float(known[key])
        known["accept_histogram"] = {int(k): int(v) for k, v in d.get("accept_histogram", {}).items()}
        known["by_source"] = {int(k): [int(drafted), int(accepted)]
                              for k, (drafted, accepted) in d.get("by_source", {}).items()}
        return cls(**known)

    @classmethod
    def merge(cls, parts: Iterable["SpeculationStats"]) -> "SpeculationStats":
        """Several requests' stats as one (the pieces of a rewrite): counters, times, histograms
        and per-source counts summed; speculative, contended and fallback if any request was;
        the decode threads of the last. No parts: a plain request's zeros."""
        total = cls(speculative=False)
        for i, part in enumerate(parts):
            if i == 0:
                total.first_token_ms = part.first_token_ms
            total.speculative = total.speculative or part.speculative
            for key in COUNT_FIELDS:
                setattr(total, key, getattr(total, key) + getattr(part, key))
            for key in _MERGED_MS_FIELDS:
                setattr(total, key, getattr(total, key) + getattr(part, key))
            for accepted, steps in part.accept_histogram.items():
                total.accept_histogram[accepted] = total.accept_histogram.get(accepted, 0) + steps
            for source, (drafted, accepted) in part.by_source.items():
                counts = total.by_source.setdefault(source, [0, 0])
                counts[0] += drafted
                counts[1] += accepted
            total.decode_threads = part.decode_threads
            total.fallback = total.fallback or part.fallback
            total.contended = total.contended or part.contended
            if part.exact is not None:  # exact only if every part was
                total.exact = part.exact if total.exact is None else total.exact and part.exact
                total.exact_reason = total.exact_reason or part.exact_reason
        return total

    def summary(self) -> str:
        """One human line, e.g. for --stats."""
        mode = "speculative" if self.speculative else "plain"
        if self.fallback:
            mode += f" (fallback: {self.fallback})"
        return (
            f"{mode}: {self.generated_tokens} tokens in {self.target_passes} passes "
            f"({self.tokens_per_pass:.2f} tokens/pass), drafted {self.drafted}, accepted "
            f"{self.accepted} ({100 * self.acceptance_rate:.0f}%); first token {self.first_token_ms:.0f} ms, "
            f"prefill {self.prefill_ms:.0f} ms ({self.prompt_tokens} prompt tokens), "
            f"decode {self.decode_ms:.0f} ms ({self.tokens_per_second:.1f} tok/s): verify {self.verify_ms:.0f} ms, "
            f"propose {self.propose_ms:.1f} ms, sample {self.sample_ms:.1f} ms"
            + (f"; one-off timings of this machine {self.calibration_ms:.0f} ms (kept for later runs)"
               if self.calibration_ms > 0 else "")
            + ("; decodes ran slow (another process on the cores): fewer threads for the rest" if self.contended
               else "")
            + ("; exact: greedy output is plain decoding's, token for token" if self.exact and self.speculative
               else f"; not exact: {self.exact_reason}" if self.exact is False and self.speculative else "")
        )

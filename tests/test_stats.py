"""lookahead.stats: the one definition of a request's `speculation` dict, read back and merged."""
from __future__ import annotations

from lookahead.stats import SpeculationStats


def _request(**counts) -> SpeculationStats:
    s = SpeculationStats(decode_threads=4, **counts)
    s.record_step(drafted=4, accepted=3, emitted=4, sources=[0, 1])
    s.record_step(drafted=0, accepted=0, emitted=1)
    s.prefill_ms, s.verify_ms, s.total_ms = 12.5, 30.25, 50.0
    return s


def test_from_dict_reads_back_what_to_dict_wrote():
    s = _request(prompt_tokens=40, reused_prompt_tokens=8, prediction_drafted=4, prediction_accepted=3)
    back = SpeculationStats.from_dict(s.to_dict())
    assert back == s
    assert back.accept_histogram == {3: 1} and back.by_source == {0: [4, 3], 1: [4, 3]}
    assert back.summary() == s.summary()
    # what a dict leaves out: zeros, and not speculative
    assert SpeculationStats.from_dict({"generated_tokens": 3}) == SpeculationStats(speculative=False,
                                                                                  generated_tokens=3)


def test_merge_sums_requests_and_keeps_the_last_decode_threads():
    a, b = _request(prompt_tokens=10), _request(prompt_tokens=20, contended=True)
    b.decode_threads = 2
    m = SpeculationStats.merge([a, b])
    assert (m.prompt_tokens, m.generated_tokens, m.target_passes, m.drafted, m.accepted) == (30, 10, 4, 8, 6)
    assert m.accept_histogram == {3: 2} and m.by_source == {0: [8, 6], 1: [8, 6]}
    assert (m.prefill_ms, m.verify_ms, m.total_ms) == (25.0, 60.5, 100.0)
    assert m.speculative and m.contended and m.decode_threads == 2 and m.fallback is None
    assert SpeculationStats.merge([]) == SpeculationStats(speculative=False)
    assert (a.prompt_tokens, a.accept_histogram, a.by_source) == (10, {3: 1}, {0: [4, 3], 1: [4, 3]})  # untouched


def test_decode_speed_leaves_out_the_prefill_and_its_first_pass():
    s = SpeculationStats(generated_tokens=11, first_pass_tokens=1, prefill_ms=300.0, calibration_ms=50.0,
                         total_ms=1350.0)
    assert s.decode_ms == 1000.0 and s.decode_tokens == 10
    assert s.tokens_per_second == 10.0
    line = s.summary()
    assert "prefill 300 ms" in line and "decode 1000 ms (10.0 tok/s)" in line
    assert "one-off timings of this machine 50 ms" in line  # never a silent part of a request's time
    assert "one-off" not in SpeculationStats(generated_tokens=1, total_ms=10.0).summary()


def test_a_merge_keeps_the_first_parts_first_token_time():
    a, b = _request(), _request()
    a.first_token_ms, b.first_token_ms, a.first_pass_tokens, b.first_pass_tokens = 40.0, 70.0, 1, 2
    m = SpeculationStats.merge([a, b])
    assert m.first_token_ms == 40.0 and m.first_pass_tokens == 3

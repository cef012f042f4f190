"""The llama.cpp build must run on this machine: batched decodes in a child process, crash reports,
the CPU-feature probe of the set-up, and `lookahead doctor`."""
from __future__ import annotations

import json
import platform
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import skip_without_exact_batches
from lookahead import cache
from lookahead.adapters import cmake_args, health


@pytest.fixture()
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOOKAHEAD_NO_CACHE", raising=False)
    monkeypatch.delenv("LOOKAHEAD_NO_HEALTH_CHECK", raising=False)
    return tmp_path / "cache"


@pytest.mark.model
def test_batched_decodes_run_in_a_child_process(model_path):
    """A batched decode of the embedded model, in a subprocess: a crash is a failure with its cause."""
    result = health.probe(model_path, context_tokens=64, reps=1)
    if result.signal is not None:
        pytest.fail(f"batched decodes crash on this machine:\n{result.cause}\n{result.error}")
    assert result.ok, result.cause
    assert set(result.timings_ms) == {"1", "8", "64"}
    assert all(ms > 0 for ms in result.timings_ms.values())
    assert result.model_desc  # the child read the model
    # Without llamafile's kernels (not listed in the build's features) batched rows are the
    # one-token rows; with them, how many rows match bit for bit depends on the data (0 to 9
    # of the first rows here), and the largest difference says how far apart they are.
    parity = result.parity
    assert parity["rows"] == health.PARITY_TOKENS and 0 <= parity["identical"] <= parity["rows"]
    assert (parity["identical"] == parity["rows"]) == (parity["max_logit_diff"] == 0.0)
    if health.system_info().get("LLAMAFILE", "0") == "0":
        assert parity["identical"] == parity["rows"]


def test_a_probe_fills_in_only_the_measurements_not_kept_yet(tmp_cache):
    """A curve learned from real requests (at their positions, with long drafts) is not
    replaced by a probe's; what is missing is filled in."""
    from lookahead.adapters.llama_cpp.state import MEASUREMENTS

    measured = {"key": "k", "decode_threads": 1, "verify_ms": {"1": 50.0, "8": 120.0}, "verify_threads": 1}
    health.keep_measurements(measured)
    assert cache.get(MEASUREMENTS, "k") == {"decode_threads": 1, "verify_ms": {"1": 50.0, "8": 120.0},
                                             "verify_threads": 1}
    learned = {"verify_ms": {"1": 31.0, "64": 400.0}, "verify_threads": 2}
    cache.put(MEASUREMENTS, "k2", learned)
    health.keep_measurements({**measured, "key": "k2"})
    assert cache.get(MEASUREMENTS, "k2") == {**learned, "decode_threads": 1}
    health.keep_measurements({"verify_ms": {"1": 1.0}})  # no key: nothing to file it under
    assert set(cache.load(MEASUREMENTS)) == {"k", "k2"}


@pytest.mark.model
def test_the_probe_keeps_a_curve_and_thread_count_for_the_first_request(model_path, tmp_cache):
    """doctor's child (the set-up's last step) keeps what lookahead's first request would
    otherwise measure: the one-token thread count and a curve over the calibration's sizes,
    its t(1) timed with that count."""
    from lookahead.adapters.llama_cpp.state import MEASUREMENTS
    from lookahead.drafter.cost import CALIBRATION_SIZES

    result = health.probe(model_path, context_tokens=64, reps=1)
    assert result.ok, result.cause
    kept = list(cache.load(MEASUREMENTS).values())
    assert len(kept) == 1
    entry = kept[0]
    assert set(entry["verify_ms"]) == {str(n) for n in {*CALIBRATION_SIZES, *health.PROBE_SIZES}}
    assert entry["verify_threads"] == entry["decode_threads"]
    assert entry["decode_threads"] in {int(n) for n in result.threads["one_token_ms"]}
    assert entry["verify_ms"]["1"] == result.timings_ms["1"]
    # filed under the key of a Llama with the defaults (as the commands and load() make it)
    import llama_cpp

    from lookahead.adapters.llama_cpp.state import measurement_key

    default = llama_cpp.Llama(model_path=str(model_path), flash_attn=True, verbose=False)
    assert list(cache.load(MEASUREMENTS)) == [measurement_key(default)]


@pytest.mark.model
def test_exact_batches_make_batched_rows_one_token_rows(model_path):
    """lookahead's patch: with LOOKAHEAD_EXACT_BATCHES=1 every batched row of the embedded model
    equals its one-token row, bit for bit (the default build's differ at a data-dependent row)."""
    skip_without_exact_batches()
    result = health.probe(model_path, context_tokens=64, reps=1, extra_env={health.EXACT_BATCHES_ENV: "1"})
    assert result.ok, result.cause
    assert result.parity["identical"] == result.parity["rows"], result.parity
    assert result.parity["max_logit_diff"] == 0.0


@pytest.mark.model
def test_prepare_leaves_the_kv_cache_and_the_llama_as_they_were(fresh):
    """`prepare` decodes 2 tokens after the cache's contents (where the build packs weights for
    small batches) and removes them: the Llama and its cache hold what they held, and the
    Llama's own next completion is the one it would have given."""
    import llama_cpp
    from lookahead.adapters.llama_cpp import LlamaCppTarget, clear_kv_cache

    prompt = "The quick brown fox jumps"
    want = fresh.create_completion(prompt, max_tokens=6, temperature=0.0)["choices"][0]["text"]
    clear_kv_cache(fresh)
    fresh.eval(fresh.tokenize(prompt.encode()))  # the prompt exactly: the Llama may sample at once
    n, held = fresh.n_tokens, list(fresh.input_ids[: fresh.n_tokens])
    target = LlamaCppTarget(fresh, threads="keep")
    ms = target.prepare()
    assert ms >= 0.0
    assert fresh.n_tokens == n and list(fresh.input_ids[:n]) == held
    assert llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(fresh.ctx), 0) == n - 1
    assert target.prepare() == ms  # once per target
    # the context's last logits are the dummy tokens' now: the next call must not sample them
    got = fresh.create_completion(prompt, max_tokens=6, temperature=0.0)["choices"][0]["text"]
    assert got == want


@pytest.mark.model
def test_prepare_does_nothing_where_weights_are_not_packed(fresh, monkeypatch):
    from lookahead.adapters import exact
    from lookahead.adapters.llama_cpp import LlamaCppTarget

    monkeypatch.setenv(exact.PACK_ENV, "0")
    target = LlamaCppTarget(fresh, threads="keep")
    n = fresh.n_tokens
    assert target.prepare() == 0.0 and fresh.n_tokens == n


class _RowsTarget:
    """Logits rows as a function of (position, token); batched rows after the first can be
    shifted, as llamafile's kernels shift them. Holds a KV length and checks rollbacks."""

    n_vocab, n_ctx, max_batch = 50, 512, 64

    def __init__(self, batch_shift: float = 0.0):
        self.n_past, self.batch_shift = 10, batch_shift

    def decode(self, tokens, n_logits):
        pos = self.n_past + np.arange(len(tokens))
        rows = np.sin(np.outer(pos * 31 + np.asarray(tokens), np.arange(self.n_vocab))).astype(np.float32)
        if len(tokens) > 1:
            rows[1:] += self.batch_shift
        self.n_past += len(tokens)
        return rows

    def rollback(self, n_keep):
        assert n_keep <= self.n_past
        self.n_past = n_keep


def test_batch_parity_compares_rows_bit_for_bit_and_rolls_back():
    same = _RowsTarget()
    assert health.batch_parity(same, 8) == {"rows": 8, "identical": 8, "max_logit_diff": 0.0}
    assert same.n_past == 10
    shifted = _RowsTarget(batch_shift=0.5)  # rows after a batch's first are off by 0.5
    assert health.batch_parity(shifted, 8) == {"rows": 8, "identical": 1, "max_logit_diff": 0.5}
    assert shifted.n_past == 10


def test_a_child_killed_by_a_signal_is_reported_with_its_stage_and_a_fix():
    crash = [sys.executable, "-c",
             "import os, signal; print('stage: decode 8', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"]
    result = health.probe("model.gguf", command=crash)
    assert not result.ok
    assert result.signal == "SIGSEGV"
    assert result.stage == "decode 8"
    assert "killed the process with SIGSEGV at stage 'decode 8'" in result.cause
    assert "Fix: rebuild llama-cpp-python" in result.cause


def test_a_child_that_fails_without_a_signal_gives_its_error():
    failing = [sys.executable, "-c", "import sys; print('stage: load'); sys.exit('no such model: x.gguf')"]
    result = health.probe("x.gguf", command=failing)
    assert not result.ok and result.signal is None and result.returncode == 1
    assert "no such model: x.gguf" in result.cause


def test_a_known_crashing_build_raises_a_clear_error_before_any_decode(tmp_cache, monkeypatch):
    monkeypatch.setattr(health, "amx_compiled", lambda info=None: True)
    monkeypatch.setattr(health, "build_identity", lambda: "build-x")
    cache.put(health.CACHE_KIND, "build-x", {"ok": False, "cause": "AMX compiled in; this VM faults on it"})

    def no_child(*args, **kwargs):
        raise AssertionError("the cached answer must be used, not a new child")

    monkeypatch.setattr(health, "probe", no_child)
    with pytest.raises(health.BackendCrash, match="AMX compiled in"):
        health.ensure_batched_decodes("model.gguf")
    cache.put(health.CACHE_KIND, "build-x", {"ok": True, "cause": ""})
    health.ensure_batched_decodes("model.gguf")  # a build that passed: no error, no child


def test_the_check_runs_once_per_build_and_caches_a_crash(tmp_cache, monkeypatch):
    monkeypatch.setattr(health, "amx_compiled", lambda info=None: True)
    monkeypatch.setattr(health, "build_identity", lambda: "build-y")
    calls = []

    def crashing_probe(model_path, **kwargs):
        calls.append(model_path)
        return health.ProbeResult(ok=False, model=str(model_path), stage="prefill", signal="SIGILL",
                                  returncode=-4, cause="killed with SIGILL")

    monkeypatch.setattr(health, "probe", crashing_probe)
    for _ in range(2):
        with pytest.raises(health.BackendCrash, match="SIGILL"):
            health.ensure_batched_decodes("m.gguf")
    assert calls == ["m.gguf"]


def test_builds_without_amx_are_not_probed(tmp_cache, monkeypatch):
    monkeypatch.setattr(health, "amx_compiled", lambda info=None: False)
    monkeypatch.setattr(health, "probe", lambda *a, **k: pytest.fail("probed a build without AMX"))
    health.ensure_batched_decodes("m.gguf")


def test_the_installed_build_has_no_amx():
    """scripts/setup.sh never compiles AMX in (opt in with CMAKE_ARGS)."""
    info = health.system_info()
    assert info, "llama_print_system_info gave nothing"
    assert info.get("AMX_INT8", "0") == "0", f"AMX compiled in: {info}"


# ---- the set-up's CPU probe ------------------------------------------------------------------------
def test_cmake_args_turn_on_only_what_runs_and_never_amx(monkeypatch):
    failing = {"GGML_AVX512"}
    monkeypatch.setattr(cmake_args.platform, "machine", lambda: "x86_64")
    bodies = {body: option for option, _, _, body in cmake_args.X86_FEATURES}

    def fake_runs(cc, flags, body, workdir):
        return (bodies[body] not in failing, "the probe died by signal 4")

    monkeypatch.setattr(cmake_args, "_runs", fake_runs)
    args = cmake_args.cmake_args()
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    assert "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args
    # everything that needs AVX-512 goes with it
    for option in ("GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert f"-D{option}=OFF" in args


def test_cmake_args_probe_really_executes_on_this_cpu():
    """The real probe: on x86-64, AVX (which every x86-64 CPU of the last decade has) compiles and
    runs; elsewhere llama.cpp's native build is kept."""
    args = cmake_args.cmake_args()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "-DGGML_AVX=ON" in args and "-DGGML_NATIVE=OFF" in args
    else:
        assert not any(a.startswith("-DGGML_NATIVE") for a in args)
    assert "-DLLAVA_BUILD=OFF" in args


# ---- lookahead doctor --------------------------------------------------------------------------------
@pytest.mark.model
def test_doctor_reports_the_build_and_the_curve():
    from lookahead.cli.main import main

    result = CliRunner().invoke(main, ["doctor", "--json", "--context", "64"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["check"]["ok"] is True
    assert set(report["check"]["timings_ms"]) == {"1", "8", "64"}
    assert report["amx"]["compiled"] is False
    assert report["llama_cpp_python"] == "0.3.36"


def test_doctor_names_a_missing_model(tmp_path):
    from lookahead.cli.main import main

    result = CliRunner().invoke(main, ["doctor", "--model", str(tmp_path / "nope.gguf")])
    assert result.exit_code == 2
    assert "model file not found" in result.output and "nope.gguf" in result.output


# --- ThreadCheck: is the tuned one-token thread count still the faster one? ----------------------

def test_thread_check_is_due_every_n_decodes_after_a_few_with_the_chosen_count():
    from lookahead.adapters.llama_cpp import ThreadCheck

    check = ThreadCheck(every=4)
    seen = []
    for i in range(12):
        if check.due():
            seen.append(i)
            check.other(0.010)  # as fast as the chosen count: no switch
        else:
            check.chosen(0.010)
    assert seen == [4, 9]  # 4 decodes with the chosen count before each check
    assert check.checks == 2


def test_thread_check_switches_on_the_median_of_its_window():
    from lookahead.adapters.llama_cpp import ThreadCheck

    check = ThreadCheck(every=1, window=5, margin=0.97)
    for _ in range(3):
        check.chosen(0.010)
    ratios = [0.90, 1.20, 0.95, 0.80, 0.99]  # median 0.95: faster by more than 3%
    switched = [check.other(0.010 * r) for r in ratios]
    assert switched == [False, False, False, False, True]
    assert not check.ratios and not check.due()  # starts afresh for the new choice
    check = ThreadCheck(every=1, window=5, margin=0.97)
    for _ in range(3):
        check.chosen(0.010)
    assert not any(check.other(0.010 * r) for r in [0.90, 1.20, 0.98, 0.80, 0.99])  # median 0.98


def test_thread_check_tries_a_clearly_slower_count_less_often():
    from lookahead.adapters.llama_cpp import ThreadCheck

    check = ThreadCheck(every=2, window=3, settled=4)
    gaps, since = [], 0
    for _ in range(60):
        if check.due():
            gaps.append(since)
            since = 0
            check.other(0.015)  # 1.5x slower
        else:
            check.chosen(0.010)
            since += 1
    assert gaps[:3] == [3, 2, 2] and set(gaps[3:]) == {8}


# ---- contention: one-token decodes against a quiet one at the same position ------------------
def test_a_quiet_decode_is_carried_to_later_positions():
    from lookahead.adapters.llama_cpp import CONTENTION_BAND, DECODE_GROWTH_TOKENS, quiet_decode_s

    growth = lambda band: 1 + band * CONTENTION_BAND / DECODE_GROWTH_TOKENS  # noqa: E731
    assert quiet_decode_s({0: 0.0065}, 7) == pytest.approx(0.0065 * growth(7))  # 1.875x at ~1,800
    assert quiet_decode_s({0: 0.0065, 7: 0.0100}, 7) == pytest.approx(0.0100)  # seen there: that
    assert quiet_decode_s({0: 0.0065, 7: 0.0200}, 7) == pytest.approx(0.0065 * growth(7))  # the least
    assert quiet_decode_s({9: 0.015}, 3) == 0.015  # a later band's, as it is (lenient)


def _watcher(fastest):
    """The adapter's contention bookkeeping, on a stand-in Llama (no llama.cpp)."""
    from collections import deque
    from types import SimpleNamespace

    from lookahead.adapters.llama_cpp import state_of
    from lookahead.adapters.llama_cpp.threads import DecodeThreads

    class FakeLlama:  # weakly referenced by the adapter's per-Llama state
        n_threads = 1
        model_params = SimpleNamespace(n_gpu_layers=0)

    llm = FakeLlama()
    state_of(llm).fastest_decode = dict(fastest)
    switched = []
    lib = SimpleNamespace(llama_set_n_threads=lambda ctx, a, b: switched.append((a, b)))
    watcher = DecodeThreads(llm, None, "auto", measurements=None, lib=lib)
    watcher.own = (1, 2)  # inside a request
    return watcher, switched


@pytest.mark.parametrize("wall_ms, contended", [(13.0, False), (24.0, True)])
def test_contention_at_a_long_position_is_judged_against_that_position(wall_ms, contended):
    """At position 2,000 a quiet one-token decode takes about 2x the fastest one seen at 10
    (measured here: 1.9-2.0x). With the threads' CPU share low (it dips in quiet runs too),
    only a decode slower than a quiet one *there* is contention."""
    from lookahead.adapters.llama_cpp import CONTENTION_WINDOW

    target, switched = _watcher({0: 0.0065})
    for _ in range(CONTENTION_WINDOW):
        target.watch(wall_ms / 1000, 0.7 * 2 * wall_ms / 1000, 2, 1, n_past=2000)
    assert target.contended is contended and bool(switched) is contended


def test_load_turns_flash_attention_on_and_reads_the_weights_unless_told_otherwise(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from lookahead.adapters.llama_cpp import wrapping

    class Loaded(Exception):
        pass

    seen = []

    def llama(**kwargs):
        seen.append(kwargs)
        raise Loaded  # only the arguments matter here

    monkeypatch.setattr(wrapping, "lib", lambda: SimpleNamespace(Llama=llama))
    monkeypatch.setattr(wrapping, "resolve", lambda model: tmp_path / "model.gguf")
    for kwargs in ({}, {"flash_attn": False}, {"use_mmap": True}):
        with pytest.raises(Loaded):
            wrapping.load("model", **kwargs)
    assert [kw["flash_attn"] for kw in seen] == [True, False, True]
    assert [kw["use_mmap"] for kw in seen] == [False, False, True]


def _keyed_llm(tmp_path, flash: int = 1):
    """What measurement_key reads of a Llama."""
    from types import SimpleNamespace

    return SimpleNamespace(model_path=str(tmp_path / "m.gguf"), n_threads=2, n_threads_batch=2, n_batch=512,
                           model_params=SimpleNamespace(n_gpu_layers=0),
                           context_params=SimpleNamespace(flash_attn_type=flash))


def test_the_measurement_key_tells_flash_attention_apart(tmp_path):
    from lookahead.adapters.llama_cpp.state import measurement_key

    on, off = measurement_key(_keyed_llm(tmp_path, 1)), measurement_key(_keyed_llm(tmp_path, 0))
    assert "flash_attn=1" in on and on != off


def test_a_curve_kept_for_another_own_thread_count_is_found_and_borrowed_with_care(tmp_path, monkeypatch):
    """Batches run with n_threads_batch, one-token decodes with the count kept beside the
    curve: a curve timed for the defaults (n_threads=1 on 2 CPUs: doctor's) serves a Llama
    made with n_threads=2; its t(1) only when it was timed with the count used here."""
    from lookahead.adapters.llama_cpp.state import MEASUREMENTS, Measurements
    from lookahead.adapters.llama_cpp.wrapping import one_token_threads, restorable_curve

    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path))
    defaults = _keyed_llm(tmp_path)
    defaults.n_threads = 1
    two = _keyed_llm(tmp_path)
    other_batch = _keyed_llm(tmp_path)
    other_batch.n_threads_batch = 4
    curve = {"1": 33.0, "8": 130.0, "64": 470.0}
    cache.put(MEASUREMENTS, Measurements(defaults).key, {"verify_ms": curve, "verify_threads": 2, "decode_threads": 2})
    assert Measurements(two).known() == {}
    sibling = Measurements(two).sibling_curve()
    assert sibling == {"verify_ms": curve, "verify_threads": 2}  # not its thread choice: another Llama's
    assert Measurements(other_batch).sibling_curve() == {}  # batches with other threads: another curve
    assert Measurements(defaults).sibling_curve() == {}  # its own entry is not a sibling
    assert one_token_threads(two, "auto") == 2  # "auto" with one candidate: no choice to wait for
    assert restorable_curve(sibling, 2, borrowed=True) == curve  # one-token decodes with 2 here too
    assert restorable_curve(sibling, 1, borrowed=True) == {"8": 130.0, "64": 470.0}
    assert restorable_curve(sibling, None, borrowed=True) == {"8": 130.0, "64": 470.0}  # not chosen yet
    assert restorable_curve({"verify_ms": curve}, 2, borrowed=True) == {"8": 130.0, "64": 470.0}
    with pytest.raises(KeyError):
        restorable_curve({}, 2, borrowed=True)


def test_the_measurement_key_tells_the_exact_mode_apart(tmp_path, monkeypatch):
    """Exact and stock kernels cost differently: a curve timed with one must not size drafts
    for the other (a process with LOOKAHEAD_EXACT_BATCHES=0 and one without share a cache)."""
    from lookahead.adapters.exact import ENV
    from lookahead.adapters.llama_cpp.state import measurement_key

    llm = _keyed_llm(tmp_path)
    monkeypatch.setenv(ENV, "1")
    exact_key = measurement_key(llm)
    monkeypatch.setenv(ENV, "0")
    stock_key = measurement_key(llm)
    assert "exact_batches=1" in exact_key and "exact_batches=0" in stock_key

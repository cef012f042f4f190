"""Exact mode's choice and report (lookahead.adapters.exact), without a model."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import flat_cost_model
from fake_target import FakeTarget
from lookahead.adapters import exact, health
from lookahead.drafter import Drafter
from lookahead.engine import ExactTarget, generate_tokens
from lookahead.index import SuffixIndex
from lookahead.sampling import SamplingParams
from lookahead.stats import SpeculationStats


def _child(code: str, env: dict[str, str | None]) -> str:
    """`code`'s last line of output in a fresh interpreter with `env` changed (None: unset)."""
    import os

    child_env = {k: v for k, v in os.environ.items() if k not in env}
    child_env.update({k: v for k, v in env.items() if v is not None})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


REPORT = ("import os, lookahead; from lookahead.adapters import exact; "
          "print(os.environ.get(exact.ENV), exact._IN_FORCE_FROM_START)")


def test_importing_lookahead_turns_exact_mode_on_unless_the_user_chose():
    assert _child(REPORT, {exact.ENV: None}) == "1 True"
    assert _child(REPORT, {exact.ENV: "0"}) == "0 False"
    assert _child(REPORT, {exact.ENV: "1"}) == "1 True"


def test_llama_cpp_imported_first_is_not_assumed_exact():
    """llama.cpp reads the variable at its first model load: lookahead cannot know that a model
    loaded before it was imported had it, unless the user set it."""
    assert _child("import llama_cpp; " + REPORT, {exact.ENV: None}) == "1 False"
    assert _child("import llama_cpp; " + REPORT, {exact.ENV: "1"}) == "1 True"


def _llama(n_gpu_layers=0, flash_attn_type=0):
    return SimpleNamespace(model_params=SimpleNamespace(n_gpu_layers=n_gpu_layers),
                           context_params=SimpleNamespace(flash_attn_type=flash_attn_type))


@pytest.fixture
def exact_build(monkeypatch):
    """A build with both patches on an AVX2 CPU, exact mode in force since the start."""
    monkeypatch.setattr(health, "build_patches", lambda lib=None: list(health.EXACT_PATCHES))
    monkeypatch.setattr(health, "system_info", lambda: {"AVX2": "1", "FMA": "1", "F16C": "1"})
    monkeypatch.setenv(exact.ENV, "1")
    monkeypatch.setattr(exact, "_IN_FORCE_FROM_START", True)
    monkeypatch.setattr(exact, "_gpu_build", lambda: True)


def test_a_cpu_llama_on_the_patched_build_is_exact(exact_build):
    assert exact.of_llama(_llama()) == exact.Exactness(True)


@pytest.mark.parametrize("exactness, file_type, padding", [
    (exact.Exactness(True), "15", (12, 16)),  # Q4_K_M: the exact K-quant kernel's tiles of 16
    (exact.Exactness(True), 18, (12, 16)),  # Q6_K
    (exact.Exactness(True), "3", None),  # Q4_1: its own kernel, 4 columns at a time
    (exact.Exactness(True), None, None),  # not recorded
    (exact.Exactness(True), "Q4_K_M", None),  # not a llama_ftype id
    (exact.Exactness(False, "--no-exact"), "15", None),  # the stock kernels: not known here
])
def test_batch_padding_follows_the_exact_kernel_of_the_file_type(exactness, file_type, padding):
    assert exact.batch_padding(exactness, file_type) == padding


@pytest.mark.parametrize("file_type, padding", [
    ("15", (17, 16)),  # Q4_K_M: Q4_K and Q6_K, whose 12-16 columns the lanes-as-columns kernel takes
    (18, (17, 16)),  # Q6_K
    ("17", (12, 16)),  # Q5_K_M: Q5_K weights keep the tiles from 12 columns
    ("14", (12, 16)),  # Q4_K_S: some layers in Q5_K
])
def test_with_avx512_vnni_up_to_16_columns_of_q4_k_and_q6_k_are_not_padded(file_type, padding):
    assert exact.batch_padding(exact.Exactness(True), file_type, avx512_vnni=True) == padding
    assert exact.batch_padding(exact.Exactness(False, "--no-exact"), file_type, avx512_vnni=True) is None


@pytest.mark.parametrize("file_type, padding", [
    ("15", None),  # Q4_K_M: every batch from the packed copy of its Q4_K and Q6_K weights
    (18, None),  # Q6_K
    ("17", (12, 16)),  # Q5_K_M: Q5_K weights are not packed
    ("14", (12, 16)),  # Q4_K_S
])
def test_with_packed_weights_no_batch_of_q4_k_and_q6_k_is_padded(file_type, padding):
    assert exact.batch_padding(exact.Exactness(True), file_type, avx512_vnni=True, packed=True) == padding
    assert exact.batch_padding(exact.Exactness(False, "--no-exact"), file_type, avx512_vnni=True, packed=True) is None


def test_packing_is_on_unless_the_environment_turns_it_off(monkeypatch):
    monkeypatch.delenv(exact.PACK_ENV, raising=False)
    assert exact.packing_on()
    monkeypatch.setenv(exact.PACK_ENV, "0")
    assert not exact.packing_on()
    monkeypatch.setenv(exact.PACK_ENV, "1")
    assert exact.packing_on()


@pytest.mark.parametrize("change, says", [
    (lambda m: m.setenv(exact.ENV, "0"), "--no-exact"),
    (lambda m: m.setattr(exact, "_IN_FORCE_FROM_START", False), "import lookahead first"),
    (lambda m: m.setattr(health, "build_patches", lambda lib=None: [health.Q4_1_KERNEL]), health.K_QUANT_EXACT),
    (lambda m: m.setattr(health, "system_info", lambda: {"AVX2": "0", "FMA": "1", "F16C": "1"}), "AVX2"),
])
def test_each_missing_condition_is_named(exact_build, monkeypatch, change, says):
    change(monkeypatch)
    result = exact.of_llama(_llama())
    assert not result.exact and says in result.reason


def test_gpu_layers_and_flash_attention_without_its_patch_are_not_exact(exact_build, monkeypatch):
    assert "GPU" in exact.of_llama(_llama(n_gpu_layers=-1)).reason
    assert "flash attention" in exact.of_llama(_llama(flash_attn_type=1)).reason
    monkeypatch.setattr(health, "build_patches",
                        lambda lib=None: [*health.EXACT_PATCHES, health.FLASH_ATTN_EXACT])
    assert exact.of_llama(_llama(flash_attn_type=1)) == exact.Exactness(True)


class _ExactFake(FakeTarget):
    batch_exact = False
    batch_exact_reason = "a test backend that rounds batches its own way"


def test_the_engine_reports_the_backend_s_exactness():
    target = _ExactFake()
    assert isinstance(target, ExactTarget)
    stats = SpeculationStats()
    list(generate_tokens(target, [2, 3, 4], SamplingParams(temperature=0.0), np.random.default_rng(0), 8,
                         Drafter(flat_cost_model(target.max_batch), max_draft=8), SuffixIndex(), stats))
    assert stats.exact is False and stats.exact_reason == target.batch_exact_reason
    assert "not exact: a test backend" in stats.summary()


def test_merged_stats_are_exact_only_if_every_part_was():
    yes, no = SpeculationStats(exact=True), SpeculationStats(exact=False, exact_reason="why")
    assert SpeculationStats.merge([yes, yes]).exact is True
    merged = SpeculationStats.merge([yes, no])
    assert merged.exact is False and merged.exact_reason == "why"
    assert SpeculationStats.merge([SpeculationStats()]).exact is None


def test_the_mode_cannot_change_once_a_model_was_seen(monkeypatch):
    monkeypatch.setenv(exact.ENV, "1")
    monkeypatch.setattr(exact, "_model_seen", True)
    exact.set_for_process(True)  # the same mode: fine
    with pytest.raises(ValueError, match="once per process"):
        exact.set_for_process(False)
    assert exact.requested()


@pytest.mark.parametrize("file_type, padding", [
    ("15", None),  # Q4_K_M: 12 or more columns of Q4_K and Q6_K in steps of 4, rows in lanes
    (18, None),  # Q6_K
    ("17", (12, 16)),  # Q5_K_M: Q5_K weights keep the tiles from 12 columns
    ("14", (12, 16)),  # Q4_K_S
])
def test_with_rows_in_lanes_no_batch_of_q4_k_and_q6_k_is_padded(file_type, padding):
    assert exact.batch_padding(exact.Exactness(True), file_type, lanes=True) == padding
    assert exact.batch_padding(exact.Exactness(False, "--no-exact"), file_type, lanes=True) is None

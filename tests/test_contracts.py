"""The backend contract in code: the Protocols of `lookahead.engine`, satisfied by the fake
target and by the llama.cpp adapter.

`isinstance` against a runtime-checkable Protocol only looks for the members' names, so
`violations` also compares each method's signature with the Protocol's: the parameters it
names, in order, their defaults, and that anything extra is optional.
"""
from __future__ import annotations

import contextlib
import inspect
import typing

import pytest

from fake_target import FakeTarget
from lookahead.api import Lookahead
from lookahead.engine import (ContendedTarget, ModelFileTarget, PlainTarget, Target, TextTarget, TreeTarget,
                              TunedTarget)

OPTIONAL = [TreeTarget, TunedTarget, ContendedTarget, PlainTarget, ModelFileTarget]
_NOT_MEMBERS = {"__init__", "__subclasshook__", "__class_getitem__", "__init_subclass__"}


def members(protocol: type) -> tuple[dict[str, type], dict[str, typing.Callable]]:
    """(attributes with their types, methods) that `protocol` and the Protocols it extends declare."""
    attributes: dict[str, type] = {}
    methods: dict[str, typing.Callable] = {}
    for base in reversed(protocol.__mro__):
        if base is object or not getattr(base, "_is_protocol", False) or base is typing.Protocol:
            continue
        attributes.update(typing.get_type_hints(base))
        methods.update({name: f for name, f in vars(base).items()
                        if inspect.isfunction(f) and not name.startswith("_") and name not in _NOT_MEMBERS})
    return attributes, methods


def signature_violations(name: str, wanted: inspect.Signature, given: inspect.Signature) -> list[str]:
    """What keeps `given` (a bound method's signature) from being called as `wanted` (the
    Protocol's, without `self`) is."""
    out = []
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    given_params = list(given.parameters.values())
    given_kinds = {p.kind for p in given_params}
    for i, want in enumerate(wanted.parameters.values()):
        if want.kind is inspect.Parameter.VAR_KEYWORD:
            if inspect.Parameter.VAR_KEYWORD not in given_kinds:
                out.append(f"{name}() takes no **{want.name}")
            continue
        if want.kind is inspect.Parameter.VAR_POSITIONAL:
            if inspect.Parameter.VAR_POSITIONAL not in given_kinds:
                out.append(f"{name}() takes no *{want.name}")
            continue
        have = given.parameters.get(want.name)
        if have is None:
            out.append(f"{name}() has no parameter {want.name!r}")
            continue
        if want.kind in plain and (have.kind not in plain or given_params.index(have) != i):
            out.append(f"{name}(): {want.name!r} is not positional parameter {i + 1}")
        if want.default is not inspect.Parameter.empty and have.default != want.default:
            out.append(f"{name}(): {want.name!r} defaults to {have.default!r}, the contract says {want.default!r}")
    for have in given_params:
        if (have.name not in wanted.parameters and have.default is inspect.Parameter.empty
                and have.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)):
            out.append(f"{name}(): parameter {have.name!r} is not in the contract and has no default")
    return out


def violations(obj: object, protocol: type) -> list[str]:
    """Every way `obj` falls short of `protocol`: missing members, attributes of the wrong
    type, methods that cannot be called as the Protocol says."""
    attributes, methods = members(protocol)
    out = []
    for name, kind in attributes.items():
        if not hasattr(obj, name):
            out.append(f"no attribute {name!r}")
        elif isinstance(kind, type) and not isinstance(getattr(obj, name), kind):
            out.append(f"{name!r} is a {type(getattr(obj, name)).__name__}, the contract says {kind.__name__}")
    for name, declared in methods.items():
        method = getattr(obj, name, None)
        if not callable(method):
            out.append(f"no method {name}()")
            continue
        wanted = inspect.signature(declared)
        wanted = wanted.replace(parameters=list(wanted.parameters.values())[1:])  # without self
        out.extend(signature_violations(name, wanted, inspect.signature(method)))
    return out


def assert_satisfies(obj: object, protocol: type) -> None:
    assert isinstance(obj, protocol), f"{type(obj).__name__} lacks members of {protocol.__name__}"
    assert violations(obj, protocol) == [], f"{type(obj).__name__} vs {protocol.__name__}"


# ---- the checker itself can fail -------------------------------------------------------------
class Misfit(FakeTarget):
    """All the names of a TextTarget, three of them wrong."""

    def decode(self, tokens):  # no n_logits
        return super().decode(tokens, len(tokens))

    def tokenize(self, text, add_bos, special=False):  # another default
        return super().tokenize(text, add_bos, special)

    def calibrate(self, sizes, reps):  # an extra parameter without a default
        return super().calibrate(sizes)


def test_the_check_sees_what_isinstance_does_not():
    misfit = Misfit()
    assert isinstance(misfit, TextTarget)  # names only
    found = violations(misfit, TextTarget)
    assert any("decode() has no parameter 'n_logits'" in v for v in found), found
    assert any("tokenize(): 'special' defaults to False" in v for v in found), found
    assert any("calibrate(): parameter 'reps'" in v for v in found), found
    assert len(found) == 3, found
    misfit.n_ctx = "256"
    assert "'n_ctx' is a str, the contract says int" in violations(misfit, Target)
    del misfit.model_name
    assert not isinstance(misfit, TextTarget) and "no attribute 'model_name'" in violations(misfit, TextTarget)


def test_members_follow_the_protocols_bases():
    attributes, methods = members(TreeTarget)
    assert {"n_ctx", "n_vocab", "max_batch", "tree_width"} <= set(attributes)
    assert {"begin", "decode", "rollback", "end", "calibrate", "decode_tree", "keep_path"} == set(methods)
    assert {"tokenize", "completion_prompt_tokens", "piece", "is_eog", "chat_completion"} <= set(members(TextTarget)[1])


# ---- the fake ---------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [Target, TextTarget, TreeTarget])
def test_the_fake_target_satisfies(protocol):
    assert_satisfies(FakeTarget(), protocol)


def test_the_fake_target_has_none_of_the_other_extensions():
    target = FakeTarget()
    assert [p for p in OPTIONAL if isinstance(target, p)] == [TreeTarget]


class FakeModelFile(FakeTarget):
    """The fake with the front ends' members: a file, a template, a prompt cache to turn off."""

    model_path = "/models/fake.gguf"
    has_chat_template = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.cache_off = 0

    @contextlib.contextmanager
    def prompt_cache_off(self):
        self.cache_off += 1
        try:
            yield
        finally:
            self.cache_off -= 1


def test_the_wrapper_passes_on_the_model_file_members():
    target = FakeModelFile()
    assert_satisfies(target, ModelFileTarget)
    fast = Lookahead(target, calibrate=False)
    assert fast.model_path == "/models/fake.gguf" and fast.has_chat_template is True
    with fast.prompt_cache_off():
        assert target.cache_off == 1
    assert target.cache_off == 0


def test_the_wrapper_over_a_target_without_them():
    target = FakeTarget(n_ctx=300, n_vocab=30)
    fast = Lookahead(target, calibrate=False)
    assert (fast.n_ctx, fast.n_vocab, fast.model_name) == (300, 30, "fake")
    assert fast.model_path is None and fast.has_chat_template is False
    with fast.prompt_cache_off():  # nothing to turn off
        out = fast.create_completion("ab", max_tokens=3, temperature=0)
    assert out["usage"]["completion_tokens"] == 3


def test_count_tokens_reads_markup_as_text():
    calls = []

    class Recording(FakeTarget):
        def tokenize(self, text, add_bos, special=True):
            calls.append((text, add_bos, special))
            return super().tokenize(text, add_bos, special)

    fast = Lookahead(Recording(), calibrate=False)
    assert fast.count_tokens("abc") == 3
    assert calls == [("abc", False, False)]
    assert fast.detokenize([5, 6]) == "<5><6>"


# ---- the llama.cpp adapter ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def adapter(llm):
    """A wrapper over the adapter's Target, as `lookahead.wrap` makes it, without the per-Llama
    state `wrap` sets up (cost curve, prefix states) that other tests' wrappers share."""
    from lookahead.adapters.llama_cpp import LlamaCppTarget

    return Lookahead(LlamaCppTarget(llm, threads="keep"), calibrate=False)


@pytest.mark.model
@pytest.mark.parametrize("protocol", [Target, TextTarget, TreeTarget, TunedTarget, ContendedTarget, PlainTarget])
def test_the_llama_cpp_target_satisfies(adapter, protocol):
    from lookahead.adapters.llama_cpp import LlamaCppTarget

    assert type(adapter.target) is LlamaCppTarget
    assert_satisfies(adapter.target, protocol)


@pytest.mark.model
def test_the_llama_cpp_target_declares_the_model_file_members(adapter):
    assert_satisfies(adapter.target, ModelFileTarget)


@pytest.mark.model
def test_the_llama_cpp_wrapper_tells_front_ends_about_its_model(adapter, llm, model_path):
    assert adapter.n_ctx == llm.n_ctx() and adapter.n_vocab == llm.n_vocab()
    assert adapter.model_path == str(model_path) == adapter.model_name
    assert adapter.has_chat_template  # SmolLM2-Instruct has one
    # one rule for counting: special-token markup is text, as references are indexed
    assert adapter.count_tokens("<|im_end|>") == len(adapter.tokenize("<|im_end|>")) > 1
    assert len(llm.tokenize(b"<|im_end|>", add_bos=False, special=True)) == 1
    assert adapter.detokenize(llm.tokenize(b"Hello world", add_bos=False)) == "Hello world"

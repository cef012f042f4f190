"""OpenAI's wire format: request models, the error body, and the usage block.

Pure data: nothing here touches the model, so every rule can be tested without one.
Requests are validated strictly (a string where a number belongs is an error, as with
OpenAI); unknown fields are ignored, so that clients sending newer or vendor-specific
fields (`user`, `metadata`, Zed's `environment`) still work. `null` means "not given".
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Most stop strings a request may carry. OpenAI allows 4; Zed's edit prediction sends 14.
MAX_STOP_STRINGS = 32
MAX_REFERENCES = 64


class APIError(Exception):
    """An error answered with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object, or APIError(400) saying what is wrong with it."""
    if not raw.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")

    def no_constants(name: str):  # json accepts NaN and Infinity; JSON does not
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})",
                       code="invalid_json") from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got a JSON {type(body).__name__}",
                       code="invalid_json")
    return body


# ---- request models ------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Prediction(_Strict):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat (the file under edit)."""

    type: Literal["content"]
    content: Union[str, list[TextPart]]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: Optional[bool] = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[Any]] = None
    function_call: Optional[Any] = None


class _Sampling(_Strict):
    """Fields both endpoints share. The extensions (`references`, `speculate`, `cache_prompt`,
    `top_k`, `min_p`, `repeat_penalty`) are ignored by OpenAI's clients and servers alike."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    n: Optional[int] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = Field(default=None, ge=0, lt=2**63)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    prediction: Optional[Prediction] = None
    user: Optional[str] = None
    # lookahead's extensions
    references: Optional[list[str]] = Field(default=None, max_length=MAX_REFERENCES)
    speculate: Optional[bool] = None
    cache_prompt: Optional[bool] = None  # false: start from an empty KV cache (pay the whole prefill)
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise APIError(400, f"'stop' holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted",
                           param="stop", code="invalid_value")
        return [s for s in stops if s]


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None
    modalities: Optional[list[str]] = None
    audio: Optional[Any] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int]]
    echo: Optional[bool] = None
    logprobs: Optional[int] = Field(default=None, ge=0, le=5)
    best_of: Optional[int] = None
    suffix: Optional[str] = None


class EditRequest(_Strict):
    """lookahead's extension endpoint, POST /v1/lookahead/edits: rewrite a buffer (or a region of
    it) by an instruction, with the buffer as the reference (`lookahead.edit.rewrite`)."""

    text: str  # the whole buffer
    instruction: str
    region: Optional[list[int]] = Field(default=None, min_length=2, max_length=2)  # [start, end) offsets
    filename: Optional[str] = None  # tells code from prose (prompt wording, fence, where pieces are cut)
    references: Optional[list[str]] = Field(default=None, max_length=MAX_REFERENCES)  # more texts to copy from
    model: Optional[str] = None
    stream: Optional[bool] = None
    max_tokens: Optional[int] = None  # over the whole rewrite (each piece is bounded by its length anyway)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    seed: Optional[int] = Field(default=None, ge=0, lt=2**63)
    speculate: Optional[bool] = None
    cache_prompt: Optional[bool] = None

    def checked_region(self) -> tuple[int, int]:
        """(start, end) of the region to rewrite, the whole text by default; APIError(400) if it
        is not inside the text."""
        if self.region is None:
            return 0, len(self.text)
        start, end = self.region
        if not 0 <= start <= end <= len(self.text):
            raise APIError(400, f"invalid 'region': [{start}, {end}] is not inside the text; expected [start, end] "
                                f"with 0 <= start <= end <= {len(self.text)} (the text's length in characters, "
                                "that is Unicode code points)", param="region", code="invalid_value")
        return start, end


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "tagged-union"}


def _param_of(loc: tuple) -> str | None:
    """pydantic's error location as OpenAI writes a param: messages[0].content."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part not in _TYPE_TAGS and "[" not in part and not part[:1].isupper():
            out += ("." if out else "") + part
    return out or None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_request(model: type[BaseModel], body: dict) -> Any:
    """Validate a JSON object against a request model; APIError(400) names the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = _param_of(tuple(err["loc"]))
        if err["type"] == "missing":
            raise APIError(400, f"missing required parameter: '{param}'", param=param,
                           code="missing_required_parameter") from None
        kind = "invalid_type" if err["type"].endswith("_type") else "invalid_value"
        raise APIError(400, f"invalid '{param}': {err['msg']}, got {_short(err.get('input'))}", param=param,
                       code=kind) from None


# ---- responses ------------------------------------------------------------------------------
def usage_block(prompt_tokens: int, completion_tokens: int, speculation: dict | None) -> dict:
    """OpenAI's usage object, with the Predicted Outputs counts.

    accepted_prediction_tokens: draft tokens taken from the prediction that the verifier kept;
    rejected_prediction_tokens: draft tokens taken from it that it refused. Both are 0 when the
    library does not report them (no prediction, or the plain path).
    """
    spec = speculation or {}
    drafted = int(spec.get("prediction_drafted", 0) or 0)
    accepted = int(spec.get("prediction_accepted", 0) or 0)
    return {
        "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens),
        "total_tokens": int(prompt_tokens) + int(completion_tokens),
        "prompt_tokens_details": {"cached_tokens": int(spec.get("reused_prompt_tokens", 0) or 0)},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": max(drafted - accepted, 0),
        },
    }

"""POST /v1/chat/completions: OpenAI's chat completions, through the model's chat template."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..checks import authorize, library_kwargs, read_body, refuse
from ..protocol import APIError, ChatRequest, parse_request
from ..responses import chat_chunk_text, respond, stream_with_usage, whole_response
from ..state import state_of


async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    authorize(state, request)
    req = parse_request(ChatRequest, await read_body(state, request))
    kwargs = library_kwargs(state, req)
    for param in ("tools", "functions"):
        if getattr(req, param):
            raise refuse(param, "tool and function calls are not implemented; send plain messages")
    if req.tool_choice not in (None, "none"):
        raise refuse("tool_choice", "tool calls are not implemented")
    if req.function_call not in (None, "none"):
        raise refuse("function_call", "function calls are not implemented")
    if req.response_format is not None and req.response_format.get("type") not in (None, "text"):
        raise refuse("response_format", f"only {{'type': 'text'}}, got {req.response_format.get('type')!r}")
    if req.modalities is not None and list(req.modalities) != ["text"]:
        raise refuse("modalities", f"text output only, got {req.modalities}")
    if req.audio is not None:
        raise refuse("audio", "text output only")
    if req.top_logprobs:
        raise refuse("top_logprobs", "this server's Llama keeps no logits for every position (logits_all=False)")
    kwargs["messages"] = chat_messages(req)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    chunks = lambda: state.library_chunks(lambda: state.fast.create_chat_completion(**kwargs),
                                          req.cache_prompt is not False)
    if not req.stream:
        job = state.submit(chunks, lambda kept: whole_response(state, kept, chat=True))
        return await respond(job, request, False)
    job = state.submit(lambda: stream_with_usage(state, chunks(), include_usage, chat_chunk_text))
    return await respond(job, request, True)


def chat_messages(req: ChatRequest) -> list[dict]:
    """OpenAI messages as the chat template takes them: text (a list of text parts joined with
    newlines), `developer` as `system`; tool messages and non-text parts are refused."""
    out = []
    for i, message in enumerate(req.messages):
        if message.role in ("tool", "function") or message.tool_calls or message.function_call:
            raise APIError(400, f"messages[{i}] is a tool or function message: tool calls are not implemented "
                                "by lookahead", param=f"messages[{i}].role", code="unsupported_parameter")
        content = message.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"content part of type {part.get('type')!r} is not supported: lookahead "
                                        "serves text models (parts of type 'text' with a string 'text')",
                                   param=f"messages[{i}].content[{j}]", code="unsupported_parameter")
                texts.append(part["text"])
            content = "\n".join(texts)
        out.append({"role": "system" if message.role == "developer" else message.role, "content": content or ""})
    return out

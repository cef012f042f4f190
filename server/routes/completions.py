"""POST /v1/completions: OpenAI's (legacy) text completions, of a text or of token ids."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..checks import authorize, library_kwargs, read_body, refuse
from ..protocol import APIError, CompletionRequest, parse_request
from ..responses import completion_chunk_text, respond, stream_with_usage, whole_response
from ..state import ServerState, state_of


async def completions(request: Request) -> Response:
    state = state_of(request)
    authorize(state, request)
    req = parse_request(CompletionRequest, await read_body(state, request))
    kwargs = library_kwargs(state, req)
    if req.best_of not in (None, 1):
        raise refuse("best_of", f"one candidate per request, got best_of={req.best_of}")
    if req.suffix:
        raise refuse("suffix", "fill-in-the-middle suffixes are not implemented; put the FIM markers "
                               "of your model in 'prompt'")
    prompt = single_prompt(state, req.prompt)
    kwargs.update(prompt=prompt, echo=bool(req.echo))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    echoed = bool(req.echo) and isinstance(prompt, str) and bool(prompt)
    chunks = lambda: state.library_chunks(lambda: state.fast.create_completion(**kwargs),
                                          req.cache_prompt is not False)
    if not req.stream:
        def collect(kept: list[dict]) -> dict:  # echo: the prompt before the text, as the library does
            echo_text = "" if not req.echo else prompt if isinstance(prompt, str) else state.fast.detokenize(prompt)
            return whole_response(state, kept, chat=False, echo_text=echo_text)

        return await respond(state.submit(chunks, collect), request, False)
    job = state.submit(lambda: stream_with_usage(state, chunks(), include_usage, completion_chunk_text,
                                                 skip_first=echoed))
    return await respond(job, request, True)


def single_prompt(state: ServerState, prompt: str | list) -> str | list[int]:
    """The request's one prompt: a text, or token ids inside the vocabulary."""
    if not isinstance(prompt, list):
        return prompt
    if not prompt:
        raise APIError(400, "'prompt' is an empty list", param="prompt", code="invalid_value")
    if all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise refuse("prompt", f"one prompt per request, got a list of {len(prompt)}")
        return prompt[0]
    bad = next((t for t in prompt if not 0 <= t < state.n_vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} in 'prompt' is outside the vocabulary (0..{state.n_vocab - 1})",
                       param="prompt", code="invalid_value")
    return prompt

"""What the server tests share: the served model's settings, OpenAI's error check, the buffers."""
from __future__ import annotations

KEY = "test-key-7f3a"
N_CTX = 1024
MODEL = "SmolLM2-135M-Instruct.Q4_1"
HELLO = [{"role": "user", "content": "Name three colours."}]
# A prompt whose 12 greedy tokens are far from a near-tie (top-two logit gap above 1.2, where
# batched and one-token decodes of this model differ by up to about 0.8): the answer is the
# same whatever the KV cache held before, so "the next answer is right" checks the cache only.
NO_TIE = "The alphabet: A, B, C, D,"
BUFFER = "Keep this line.\n\nteh cat sat on teh mat.\n\nKeep this one too.\n"
# About 1,400 tokens: longer than the server's context, so it is rewritten in pieces.
LONG_BUFFER = "\n".join(f"## Step {i}\n\nStep {i} of the backup plan: copy the folder named alpha{i} to the disk "
                        f"labelled B{i} and check teh copy.\n" for i in range(1, 41))


def assert_openai_error(response, status, param=None, code=None, says=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if says is not None:
        assert says in error["message"], error


def stream_chat(client, **kw):
    """(text, chunks) of a streamed chat completion through the `openai` client."""
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def sse_data(response) -> list[str]:
    """The `data:` payloads of a server-sent-events response, which must end with [DONE]."""
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return data[:-1]

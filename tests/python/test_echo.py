"""`echo` and `prompt_logprobs` on /v1/completions through the official
openai client, streaming and not."""

import pytest

from test_openai_client import MODEL, Server

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def client():
    s = Server()
    yield s.client()
    s.stop()


def streamed(client, **args):
    """The text, tokens, values and prompt_logprobs of a streamed completion."""
    text, tokens, values, prompt_logprobs = "", [], [], None
    for i, chunk in enumerate(client.completions.create(**args, stream=True)):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.text
        if choice.logprobs:
            tokens += choice.logprobs.tokens
            values += choice.logprobs.token_logprobs
        extra = choice.model_extra or {}
        if extra.get("prompt_logprobs") is not None:
            assert i == 0, "prompt_logprobs after the first chunk"
            prompt_logprobs = extra["prompt_logprobs"]
    return text, tokens, values, prompt_logprobs


def test_echo_with_logprobs_stream_and_not(client):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2, echo=True)
    full = client.completions.create(**args, extra_body={"prompt_logprobs": 1})
    choice = full.choices[0]
    prompt_tokens = full.usage.prompt_tokens
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == prompt_tokens + full.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert "".join(lp.tokens[:prompt_tokens]) == PROMPT
    # The first prompt token has nothing before it to be scored against.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert token in top and abs(top[token] - value) < 1e-6

    # vLLM's prompt_logprobs: per prompt token, id -> {logprob, rank, decoded_token}.
    prompt_logprobs = choice.model_extra["prompt_logprobs"]
    assert len(prompt_logprobs) == prompt_tokens and prompt_logprobs[0] is None
    for i, entry in enumerate(prompt_logprobs[1:], start=1):
        first = next(iter(entry.values()))
        assert first["decoded_token"] == lp.tokens[i]
        assert first["logprob"] == lp.token_logprobs[i]
        assert first["rank"] >= 1

    # The completion after the echo is the one without it.
    plain = client.completions.create(**dict(args, echo=False))
    assert choice.text == PROMPT + plain.choices[0].text
    assert lp.token_logprobs[prompt_tokens:] == plain.choices[0].logprobs.token_logprobs

    text, tokens, values, streamed_prompt_logprobs = streamed(
        client, **args, extra_body={"prompt_logprobs": 1}
    )
    assert (text, tokens, values) == (choice.text, lp.tokens, lp.token_logprobs)
    assert streamed_prompt_logprobs == prompt_logprobs


def test_echo_of_the_prompt_alone(client):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    full = client.completions.create(**args)
    assert full.choices[0].text == PROMPT
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 0
    text, tokens, _, _ = streamed(client, **args)
    assert text == PROMPT and tokens == []

"""The official openai and anthropic clients against `kestrel serve` running a
tiny random model with a long context (262,144 positions, Qwen3.6's own):
prompts of 5,000 to 12,000 tokens, past the bundled model's 4,096 and short
enough for a CPU to prefill in seconds, through chat, completions, the
Responses and the Messages API, streamed and not; constrained output and forced tool calls after a long prompt; n > 1
sharing a long prefill; token counts; a prompt over the limit refused.

The model's weights are random (written at test time from
`testdata/long_context/config.json` by `scripts/write_checkpoint.py`; the
bundled model's tokenizer and chat template are copied in), so its words are
noise: what is tested is that long requests are handled as short ones are.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import anthropic
import jsonschema
import openai
import pytest

from test_openai_client import Server, prefix_cache_hits

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "models" / "kestrel-tiny-qwen35"
NAME = "long-random"
# A served context well past the bundled model's own.
CONTEXT = 65536
# The random model never ends a reasoning block of its own accord; the
# bundled template opens one unless told not to.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("long_context")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "write_checkpoint.py"),
         "--config", str(ROOT / "testdata" / "long_context" / "config.json"), "--out", str(out), "--seed", "7"],
        check=True, stdout=subprocess.DEVNULL,
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(BUNDLED / name, out / name)
    return out


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server("--model", str(model_dir), "--served-model-name", NAME, "--max-model-len", str(CONTEXT))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)


def document(words, salt):
    """Text of about `words` words, different for every salt (so one test's
    prompt is not another's cached prefix)."""
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "zeta", "lambda"]
    return " ".join(f"{vocab[(i * 7 + salt) % len(vocab)]}{(i * salt) % 97}" for i in range(words))


def prompt_tokens(client, text):
    r = client.completions.create(model=NAME, prompt=text, max_tokens=1, temperature=0)
    return r.usage.prompt_tokens


def test_the_model_serves_its_long_context(client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert prompt_tokens(client, document(2800, 1)) > 10_000


def test_long_chat_stream_equals_whole(client):
    messages = [
        {"role": "system", "content": document(900, 2)},
        {"role": "user", "content": document(500, 3) + "\nSummarise."},
    ]
    args = dict(model=NAME, messages=messages, max_tokens=16, temperature=0, extra_body=NO_THINKING)
    whole = client.chat.completions.create(**args)
    assert whole.usage.prompt_tokens > 5_000
    assert whole.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_long_completion_with_logprobs(client):
    r = client.completions.create(model=NAME, prompt=document(1300, 4), max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.usage.prompt_tokens > 5_000
    assert len(lp.tokens) == 8 and all(v <= 0 for v in lp.token_logprobs)
    # Greedy: each chosen token is the best alternative.
    assert all(top[t] == max(top.values()) for t, top in zip(lp.tokens, lp.top_logprobs))


def test_long_messages_and_count_tokens(claude):
    system = document(1000, 5)
    messages = [{"role": "user", "content": document(300, 6)}]
    counted = claude.messages.count_tokens(model=NAME, system=system, messages=messages)
    assert counted.input_tokens > 5_000
    with claude.messages.stream(model=NAME, max_tokens=12, system=system, messages=messages,
                                extra_body={"temperature": 0}) as stream:
        message = stream.get_final_message()
    assert message.usage.input_tokens == counted.input_tokens
    assert message.usage.output_tokens == 12
    assert message.stop_reason == "max_tokens"
    # The same request unstreamed reads the prompt from the cache and says the same.
    again = claude.messages.create(model=NAME, max_tokens=12, system=system, messages=messages,
                                   extra_body={"temperature": 0})
    assert [b.text for b in again.content if b.type == "text"] == [b.text for b in message.content if b.type == "text"]


def test_long_responses_input(client):
    r = client.responses.create(model=NAME, input=document(1300, 8), max_output_tokens=10, temperature=0)
    assert r.status == "incomplete"
    assert r.usage.input_tokens > 5_000 and r.usage.output_tokens == 10


SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 20},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "keywords": {"type": "array", "maxItems": 3, "items": {"enum": ["alpha", "beta", "gamma"]}},
    },
    "required": ["topic", "score", "keywords"],
    "additionalProperties": False,
}


def test_constrained_output_after_a_long_prompt(client):
    r = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": document(1300, 9)}],
        response_format={"type": "json_schema", "json_schema": {"name": "summary", "schema": SCHEMA, "strict": True}},
        max_tokens=400,
        temperature=1.0,
        seed=4,
        extra_body=NO_THINKING,
    )
    assert r.usage.prompt_tokens > 5_000
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_forced_tool_call_after_a_long_history(client):
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {
        "type": "object",
        "properties": {"pattern": {"type": "string", "maxLength": 30}, "max_hits": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["pattern", "max_hits"],
        "additionalProperties": False,
    }}}]
    history = [
        {"role": "user", "content": document(700, 10)},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x", "max_hits": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": document(700, 11)},
        {"role": "user", "content": "Again."},
    ]
    r = client.chat.completions.create(model=NAME, messages=history, tools=tools, tool_choice="required",
                                       max_tokens=200, temperature=1.0, seed=9)
    assert r.usage.prompt_tokens > 5_000
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "grep"
    jsonschema.validate(json.loads(call.function.arguments), tools[0]["function"]["parameters"])


def test_n_choices_share_one_long_prefill(server, client):
    before = prefix_cache_hits(server)
    r = client.completions.create(model=NAME, prompt=document(1300, 12), max_tokens=4, temperature=1.0, seed=1, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 12
    # Choices 1 and 2 found nearly all of choice 0's prompt in the cache.
    assert prefix_cache_hits(server) - before >= 2 * (r.usage.prompt_tokens - 16)


def test_a_prompt_over_the_context_is_refused_and_the_server_goes_on(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt=document(30000, 13), max_tokens=4)
    assert "context" in str(refused.value).lower() or "length" in str(refused.value).lower()
    r = client.completions.create(model=NAME, prompt=document(100, 14), max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4

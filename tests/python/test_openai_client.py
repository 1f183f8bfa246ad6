"""The official openai Python client against a real `kestrel serve`.

The server binary comes from $KESTREL_BIN (scripts/test-python.sh builds it);
each server runs the bundled model on a free port.
"""

import json
import os
import socket
import subprocess
import time
import urllib.request

import openai
import pytest

MODEL = "kestrel-tiny-qwen35"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra_args):
        binary = os.environ.get("KESTREL_BIN", "target/release/kestrel")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", str(self.port), *extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kestrel serve exited: {self.proc.stderr.read().decode()}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("kestrel serve did not become ready")

    def client(self, api_key="unused"):
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=api_key, max_retries=0, timeout=60)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


CHAT = dict(
    model=MODEL,
    messages=[{"role": "user", "content": "def read_config(path):"}],
    max_tokens=32,
    temperature=0,
    seed=3,
)


def collect_stream(stream):
    """Concatenated reasoning and content, finish reason, usage, chunk count."""
    reasoning, content, finish, usage = "", "", None, None
    chunks = list(stream)
    for i, chunk in enumerate(chunks):
        if not chunk.choices:
            assert usage is None, "exactly one usage chunk"
            assert i == len(chunks) - 1
            usage = chunk.usage
            continue
        assert chunk.usage is None
        delta = chunk.choices[0].delta
        assert (delta.role == "assistant") == (i == 0), "role only in the first chunk"
        extra = delta.model_extra or {}
        if extra.get("reasoning_content"):
            assert extra["reasoning"] == extra["reasoning_content"]
            reasoning += extra["reasoning_content"]
        content += delta.content or ""
        if chunk.choices[0].finish_reason:
            assert finish is None, "one finish chunk"
            finish = chunk.choices[0].finish_reason
    return reasoning, content, finish, usage


def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_chat_stream_equals_non_stream(client):
    full = client.chat.completions.create(**CHAT)
    msg = full.choices[0].message
    extra = msg.model_extra or {}
    assert extra.get("reasoning") == extra.get("reasoning_content")
    stream = client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    reasoning, content, finish, usage = collect_stream(stream)
    assert reasoning == (extra.get("reasoning_content") or "")
    assert content == (msg.content or "")
    assert finish == full.choices[0].finish_reason
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.completion_tokens == full.usage.completion_tokens == 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_thinking_off_has_no_reasoning(client):
    r = client.chat.completions.create(**CHAT, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    assert "reasoning_content" not in (msg.model_extra or {})
    assert "<think>" not in (msg.content or "")


def test_tools_request(client):
    tools = [{
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }]
    r = client.chat.completions.create(**CHAT, tools=tools)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    for call in choice.message.tool_calls or []:
        assert call.id.startswith("call_")
        assert call.function.name == "read_file"
        assert isinstance(json.loads(call.function.arguments), dict)
    # Streaming the same request gives the same content and calls.
    reasoning, content, finish, _ = collect_stream(
        client.chat.completions.create(**CHAT, tools=tools, stream=True, stream_options={"include_usage": True})
    )
    assert content == (choice.message.content or "")
    assert finish == choice.finish_reason
    # A history with an assistant tool call (string arguments) and its result renders.
    history = [
        {"role": "user", "content": "show setup.py"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"setup.py\"}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "import setuptools"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=8)
    assert r.usage.completion_tokens >= 1


def test_completion_stop_strings(client):
    base = client.completions.create(model=MODEL, prompt="import os\n\ndef main(", max_tokens=30, temperature=0)
    text = base.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = text[: text.index(stop)]
    r = client.completions.create(model=MODEL, prompt="import os\n\ndef main(", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="import os\n\ndef main(", max_tokens=30, temperature=0, stop=[stop], stream=True
        )
        if c.choices
    )
    assert streamed == cut


def test_errors_raise_openai_exceptions(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=3)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x = 1\n" * 3000, max_tokens=4)
    assert "maximum context length" in e.value.message


def test_api_key():
    s = Server("--api-key", "sekrit")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert [m.id for m in s.client("sekrit").models.list().data] == [MODEL]
    finally:
        s.stop()


def check_chat_logprobs(entries, top):
    for e in entries:
        assert e.logprob <= 0
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token
        assert len(e.top_logprobs) == top
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)
        # The chosen token is at most as likely as the best alternative.
        if top:
            assert e.logprob <= values[0] + 1e-6


def test_chat_logprobs_stream_and_not(client):
    args = dict(CHAT, max_tokens=12, logprobs=True, top_logprobs=3)
    full = client.chat.completions.create(**args)
    entries = full.choices[0].logprobs.content
    assert len(entries) == full.usage.completion_tokens == 12
    check_chat_logprobs(entries, 3)
    streamed = []
    for chunk in client.chat.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    # Greedy: the chosen token is the most likely one.
    assert all(e.token == e.top_logprobs[0].token for e in entries)
    # Without logprobs there are none.
    assert client.chat.completions.create(**CHAT).choices[0].logprobs is None


def test_completion_logprobs_stream_and_not(client):
    args = dict(model=MODEL, prompt="def add(a, b):", max_tokens=10, temperature=0, logprobs=2)
    full = client.completions.create(**args)
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert "".join(lp.tokens) == full.choices[0].text
    assert lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0
        assert token in top and abs(top[token] - value) < 1e-6
    tokens, values = [], []
    for chunk in client.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
    assert (tokens, values) == (lp.tokens, lp.token_logprobs)


def prefix_cache_hits(server):
    with urllib.request.urlopen(f"{server.base}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                return float(line.split()[-1])
    raise AssertionError("no prefix-cache hit counter")


def test_n_choices_share_the_prefill(server, client):
    # A prompt no other test sends, long enough to fill several KV pages.
    prompt = "class Inventory:\n    " + "def item_%d(self): pass\n    " * 24
    before = prefix_cache_hits(server)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0.8, seed=5, n=4)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.prompt_tokens < 400
    assert r.usage.completion_tokens == 4 * 6
    # Choices 1..3 found choice 0's prompt pages in the cache.
    assert prefix_cache_hits(server) - before >= 3 * 16
    chat = client.chat.completions.create(**dict(CHAT, max_tokens=5), n=4)
    assert [c.index for c in chat.choices] == [0, 1, 2, 3]
    # Greedy: every choice is the same.
    assert len({c.message.content for c in chat.choices}) == 1
    assert chat.usage.completion_tokens == 4 * 5


def test_n_choices_stream_interleaved(client):
    stream = client.chat.completions.create(
        **dict(CHAT, max_tokens=6), n=3, stream=True, stream_options={"include_usage": True}
    )
    finished, usage = {}, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        for c in chunk.choices:
            if c.finish_reason:
                assert c.index not in finished, "one finish chunk per choice"
                finished[c.index] = c.finish_reason
    assert sorted(finished) == [0, 1, 2]
    assert usage.completion_tokens == 3 * 6

"""The official anthropic Python client against a real `kestrel serve`
(`/v1/messages`, `/v1/messages/count_tokens`).

The server binary comes from $KESTREL_BIN (scripts/test-python.sh builds it).
"""

import anthropic
import pytest

from test_openai_client import MODEL, Server

KEY = "test-key"


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=60)


MESSAGE = dict(
    model=MODEL,
    max_tokens=16,
    # This SDK version has no `temperature` argument; the server still reads it.
    extra_body={"temperature": 0},
    system=[{"type": "text", "text": "You write Python."}],
    thinking={"type": "disabled"},
    messages=[{"role": "user", "content": "def read_config(path):"}],
)

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def test_message_and_stream_agree(client):
    msg = client.messages.create(**MESSAGE)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in msg.content] == ["text"]
    assert isinstance(msg.usage.input_tokens, int) and msg.usage.output_tokens > 0

    with client.messages.stream(**MESSAGE) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_count_tokens_matches_usage(client):
    count = client.messages.count_tokens(
        model=MODEL, system=MESSAGE["system"], thinking=MESSAGE["thinking"], messages=MESSAGE["messages"]
    )
    msg = client.messages.create(**MESSAGE)
    assert count.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)


def test_tool_round_trip(client):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "20 C", "is_error": False},
                {"type": "text", "text": "And Rome?"},
            ],
        },
    ]
    msg = client.messages.create(
        model=MODEL,
        max_tokens=24,
        extra_body={"temperature": 0},
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=history,
    )
    calls = [b for b in msg.content if b.type == "tool_use"]
    if calls:
        assert calls[0].name == "get_weather" and isinstance(calls[0].input, dict)
        assert msg.stop_reason == "tool_use"
    else:
        # The bundled model has never seen a tool call and may not close it
        # within max_tokens; the grammar still names the forced tool.
        # The bundled model's template writes XML calls; the text may be cut short.
        head = '<tool_call>\n<function=get_weather>'
        text = msg.content[0].text
        assert text.startswith(head) or (len(text) > len('<tool_call>\n') and head.startswith(text))
        assert msg.stop_reason == "max_tokens"
        assert msg.stop_reason == "max_tokens"


def test_errors_are_typed(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [{"type": "nope"}]}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-none", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    bad_key = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(**MESSAGE)
    assert client.messages.create(**MESSAGE).content

"""The official openai Python client's Responses API (`client.responses`)
against a real `kestrel serve`.

The server binary comes from $KESTREL_BIN (scripts/test-python.sh builds it).
"""

import json

import openai
import pytest

from test_openai_client import MODEL, Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


REQUEST = dict(
    model=MODEL,
    instructions="You write Python.",
    input="def read_config(path):",
    max_output_tokens=16,
    temperature=0,
    reasoning={"effort": "none"},
    store=False,
)

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
        "strict": True,
    }
]


def test_response_and_stream_agree(client):
    r = client.responses.create(**REQUEST)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
        assert r.usage.output_tokens == 16
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0

    events = list(client.responses.create(**REQUEST, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{r.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text
    final = events[-1].response
    assert final.output_text == r.output_text
    assert final.usage.output_tokens == r.usage.output_tokens


def test_reasoning_item(client):
    r = client.responses.create(**dict(REQUEST, reasoning={"effort": "low"}))
    assert r.output[0].type == "reasoning"
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "20 C"},
    {"role": "user", "content": [{"type": "input_text", "text": "And Rome?"}]},
]

# A forced function: a grammar constrains the call, which ends well within
# the limit (the bundled model, left alone, rarely stops). Its calls are
# XML, with the city as raw text: bounded, as the model does not end free
# text of its own accord.
FORCED_CALL = dict(
    model=MODEL,
    input=HISTORY,
    tools=TOOLS,
    tool_choice={"type": "function", "name": "get_weather"},
    max_output_tokens=160,
    temperature=0,
)


def test_function_call_round_trip(client):
    r = client.responses.create(**FORCED_CALL)
    assert r.status == "completed"
    assert [item.type for item in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments), dict)
    # The SDK's own item goes back as input, with its output.
    follow = client.responses.create(
        model=MODEL,
        input=HISTORY + [call, {"type": "function_call_output", "call_id": call.call_id, "output": "25 C"}],
        tools=TOOLS,
        max_output_tokens=4,
    )
    assert follow.usage.output_tokens >= 1


def test_stream_helper_gives_the_final_response(client):
    whole = client.responses.create(**FORCED_CALL)
    with client.responses.stream(**FORCED_CALL) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output] == ["function_call"]
    assert final.output[0].name == "get_weather"
    assert final.output[0].arguments == whole.output[0].arguments
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_errors_raise_openai_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id"
    assert "does not store" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "nope"}]}])
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-none", input="hi")
    assert client.responses.create(**REQUEST).output

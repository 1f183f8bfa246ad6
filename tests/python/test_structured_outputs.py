"""Structured outputs through the official openai client: `response_format`
with a JSON schema (parsed and checked), json_object, and a forced tool
call, against a real `kestrel serve` with the bundled model."""

import json

import openai
import pytest

from test_openai_client import MODEL, Server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def client():
    s = Server()
    yield s.client()
    s.stop()


def ask(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=200,
        extra_body=NO_THINKING,
        **kwargs,
    )


def check(person):
    assert set(person) == {"name", "age", "color"}
    assert isinstance(person["name"], str) and len(person["name"]) <= 12
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 99
    assert person["color"] in ("red", "green", "blue")


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, seed=5)])
def test_json_schema_output_parses_and_validates(client, sampling):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    r = ask(client, response_format=fmt, **sampling)
    assert r.choices[0].finish_reason == "stop"
    check(json.loads(r.choices[0].message.content))


def test_json_schema_streamed_equals_unstreamed(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    whole = ask(client, response_format=fmt, temperature=0).choices[0].message.content
    stream = ask(client, response_format=fmt, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole


def test_json_object_starts_an_object(client):
    r = ask(client, response_format={"type": "json_object"}, temperature=0)
    content = r.choices[0].message.content
    assert content.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_forced_tool_call_names_the_tool(client):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["id"],
        "additionalProperties": False,
    }}}]
    r = ask(client, tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "lookup"
    assert 0 <= json.loads(call.function.arguments)["id"] <= 9


def test_a_bad_schema_is_a_400_and_the_next_request_works(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}
    with pytest.raises(openai.BadRequestError):
        ask(client, response_format=fmt)
    assert ask(client, temperature=0).choices[0].message.content is not None

"""Constrained output against a set of schemas, checked by an independent
validator: every answer of the official openai and anthropic clients must
parse and validate (the `jsonschema` package, formats included) against the
schema it was asked for, on 100 % of the set, streamed and not, greedy and
sampled. Forced tool calls must name a declared tool and carry arguments
valid against that tool's parameter schema.

The model is the bundled one: what it would say unconstrained is noise for
these prompts, so every answer that validates is the grammar's doing.
"""

import json

import anthropic
import jsonschema
import pytest

from test_openai_client import MODEL, Server

KEY = "schema-key"

NAME = {"type": "string", "minLength": 1, "maxLength": 16}

SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {
            "name": NAME,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "height": {"type": "number", "minimum": 0.5, "maximum": 2.5},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "height", "active"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": NAME,
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": NAME,
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1, "maximum": 999},
                        "tags": {
                            "type": "array",
                            "maxItems": 3,
                            "items": {"enum": ["new", "used", "broken"]},
                        },
                    },
                    "required": ["id", "tags"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {
            "status": {"enum": ["open", "closed", "pending"]},
            "priority": {"enum": [1, 2, 3]},
            "label": {"enum": ["bug", None, True]},
            "kind": {"const": "ticket"},
        },
        "required": ["status", "priority", "label", "kind"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "title": NAME,
            "subtitle": NAME,
            "pages": {"type": "integer", "minimum": 1, "maximum": 5000},
        },
        "required": ["title"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "result": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"ok": {"const": True}, "value": {"type": "number"}},
                        "required": ["ok", "value"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"ok": {"const": False}, "error": NAME},
                        "required": ["ok", "error"],
                        "additionalProperties": False,
                    },
                ]
            }
        },
        "required": ["result"],
        "additionalProperties": False,
    },
    "nullable_and_unions": {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"], "maxLength": 20},
            "count": {"type": ["integer", "null"], "minimum": 0, "maximum": 50},
            "value": {"anyOf": [{"type": "integer", "maximum": 10, "minimum": -10}, {"type": "boolean"}]},
        },
        "required": ["note", "count", "value"],
        "additionalProperties": False,
    },
    "refs": {
        "type": "object",
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -100, "maximum": 100},
                    "y": {"type": "integer", "minimum": -100, "maximum": 100},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "properties": {
            "start": {"$ref": "#/$defs/point"},
            "end": {"$ref": "#/$defs/point"},
            "via": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/point"}},
        },
        "required": ["start", "end", "via"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
        },
        "required": ["day", "id", "code"],
        "additionalProperties": False,
    },
    "matrix": {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "minItems": 2,
                "maxItems": 3,
                "items": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 3,
                    "items": {"type": "number", "minimum": -1, "maximum": 1},
                },
            }
        },
        "required": ["rows"],
        "additionalProperties": False,
    },
    "all_of": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ]
    },
    "deep": {
        "type": "object",
        "properties": {
            "l1": {
                "type": "object",
                "properties": {
                    "l2": {
                        "type": "object",
                        "properties": {
                            "l3": {
                                "type": "object",
                                "properties": {"leaf": {"enum": ["x", "y"]}, "n": {"type": "integer", "minimum": 0, "maximum": 3}},
                                "required": ["leaf", "n"],
                                "additionalProperties": False,
                            }
                        },
                        "required": ["l3"],
                        "additionalProperties": False,
                    }
                },
                "required": ["l2"],
                "additionalProperties": False,
            }
        },
        "required": ["l1"],
        "additionalProperties": False,
    },
}

# Greedy, and sampled (seeded, hot, so the sampler wanders where the
# grammar lets it). Thinking stays off: the bundled model is not a thinking
# model and does not end a reasoning block of its own accord, so with
# thinking on its output never reaches the constraint, which starts after
# `</think>` (kestrel-structured's grammar tests check that start).
MODES = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=1.2, seed=11),
}

# Known limitation, not a wrong answer: greedy, this model extends the
# decimal fraction of `height` with zeros ("1.000...") until max_tokens, and
# the answer ends with finish_reason "length". JSON puts no bound on a
# number's digits and neither does llguidance's grammar of one; what was
# written is a prefix of a valid document.
GREEDY_DIGITS = {("flat", "greedy")}


def validate(schema, text):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client(KEY)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=60)


def chat(client, mode, **kwargs):
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer with the JSON object asked for."}],
        max_tokens=600,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, **kwargs.pop("extra_body", {})},
        **MODES[mode],
        **kwargs,
    )


def test_the_set_is_valid_json_schema():
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_response_format_output_validates(client, name, mode, request):
    if (name, mode) in GREEDY_DIGITS:
        request.applymarker(pytest.mark.xfail(strict=True, reason="greedy zeros in a decimal fraction"))
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": mode != "sampled"}}
    r = chat(client, mode, response_format=fmt)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    validate(schema, r.choices[0].message.content)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_streamed_output_validates_and_equals_the_whole(client, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    whole = chat(client, "sampled", response_format=fmt).choices[0].message.content
    stream = chat(client, "sampled", response_format=fmt, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole
    validate(schema, streamed)


@pytest.mark.parametrize("field", ["guided_json", "structured_outputs"])
def test_vllm_extra_body_fields_validate(client, field):
    for name in ("nested", "any_of", "refs"):
        schema = SCHEMAS[name]
        body = {field: schema} if field == "guided_json" else {field: {"json": schema}}
        r = chat(client, "sampled", extra_body=body)
        validate(schema, r.choices[0].message.content)


def test_completions_with_a_schema_validate(client):
    for name in ("flat", "matrix", "formats"):
        schema = SCHEMAS[name]
        r = client.completions.create(
            model=MODEL, prompt="JSON:", max_tokens=600, temperature=1.0, seed=2,
            extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}},
        )
        assert r.choices[0].finish_reason == "stop"
        validate(schema, r.choices[0].text)


# A coding agent's kind of tool set: parameter schemas of every shape above.
TOOLS = {
    "read_file": {
        "type": "object",
        "properties": {"path": {"type": "string", "maxLength": 40}, "offset": {"type": "integer", "minimum": 0, "maximum": 10000}},
        "required": ["path"],
        "additionalProperties": False,
    },
    "set_status": SCHEMAS["enums"],
    "move": SCHEMAS["refs"],
    "report": SCHEMAS["any_of"],
    "tag_items": SCHEMAS["array_of_objects"],
    "no_arguments": {"type": "object", "properties": {}, "additionalProperties": False},
}


def openai_tools():
    return [
        {"type": "function", "function": {"name": name, "description": f"Tool {name}", "parameters": schema}}
        for name, schema in TOOLS.items()
    ]


def check_call(name, arguments):
    assert name in TOOLS, f"undeclared tool {name!r}"
    jsonschema.validate(arguments, TOOLS[name], format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("seed", range(6))
def test_required_tool_calls_name_a_declared_tool_with_valid_arguments(client, seed):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Use a tool."}],
        tools=openai_tools(),
        tool_choice="required",
        max_tokens=600,
        temperature=1.2,
        seed=seed,
        parallel_tool_calls=seed % 2 == 0,
    )
    choice = r.choices[0]
    # With parallel calls the grammar lets the model go on calling until its
    # budget runs out; the calls completed by then are returned.
    assert choice.finish_reason == "tool_calls" or (
        seed % 2 == 0 and choice.finish_reason == "length" and r.usage.completion_tokens == 600
    )
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call.function.name, json.loads(call.function.arguments))


@pytest.mark.parametrize("name", list(TOOLS))
def test_named_tool_calls_have_valid_arguments(client, name):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Go."}],
        tools=openai_tools(),
        tool_choice={"type": "function", "function": {"name": name}},
        max_tokens=600,
        temperature=1.0,
        seed=7,
        stream=True,
    )
    names, arguments = {}, {}
    for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.function.name:
                names[delta.index] = delta.function.name
            arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
    assert list(names.values()) == [name]
    check_call(name, json.loads(arguments[0]))


def anthropic_tools():
    return [{"name": name, "description": f"Tool {name}", "input_schema": schema} for name, schema in TOOLS.items()]


@pytest.mark.parametrize("seed", range(4))
def test_anthropic_any_tool_choice_is_a_declared_tool_with_valid_input(claude, seed):
    r = claude.messages.create(
        model=MODEL,
        max_tokens=600,
        messages=[{"role": "user", "content": "Use a tool."}],
        tools=anthropic_tools(),
        tool_choice={"type": "any", "disable_parallel_tool_use": seed % 2 == 1},
        # Anthropic has no seed: each run samples anew, and every sample must validate.
        extra_body={"temperature": 1.2},
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    # Parallel calls may go on until the budget runs out (as in the openai test).
    assert r.stop_reason == "tool_use" or (
        seed % 2 == 0 and r.stop_reason == "max_tokens" and r.usage.output_tokens == 600
    )
    assert uses
    for use in uses:
        check_call(use.name, use.input)


@pytest.mark.parametrize("name", ["move", "report", "read_file"])
def test_anthropic_named_tool_streamed_has_valid_input(claude, name):
    with claude.messages.stream(
        model=MODEL,
        max_tokens=600,
        messages=[{"role": "user", "content": "Go."}],
        tools=anthropic_tools(),
        tool_choice={"type": "tool", "name": name},
        extra_body={"temperature": 1.0},
    ) as stream:
        message = stream.get_final_message()
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [u.name for u in uses] == [name]
    check_call(name, uses[0].input)

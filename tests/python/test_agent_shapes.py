"""Coding agents' request shapes against a real `kestrel serve` with a long
context: a Claude Code-shaped `/v1/messages` request through the anthropic
client and a Qwen Code-shaped chat request through the openai client.

The shapes follow the clients' public request formats (what a logging proxy
between them and an API shows): large system prompts split into blocks with
`cache_control`, a billing line first in Claude Code's system, a dozen or more
tools whose JSON schemas carry `$schema` and `additionalProperties`, earlier
tool rounds in the history, `<system-reminder>` blocks, `metadata`, thinking,
the beta query and headers, streaming with usage. The texts are generated
here; none is a client's own prompt. The model is the bundled one, served
with a 64K context (it was trained on 4K, so its words are noise; the
request handling is what is tested).
"""

import json
import urllib.request

import anthropic
import pytest

from test_openai_client import MODEL, Server

KEY = "agent-key"
# Claude Code asks for 32,000 output tokens; the context must hold them.
CONTEXT = 65536


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY, "--max-model-len", str(CONTEXT), "--allow-long-max-model-len")
    yield s
    s.stop()


def guidance(topic, sentences):
    """Instruction-like filler about `topic`, different for every topic."""
    verbs = ["check", "read", "prefer", "avoid", "explain", "keep", "run", "list", "quote", "split"]
    things = ["the file", "the tests", "the diff", "each path", "the user's words", "the output", "errors"]
    out = []
    for i in range(sentences):
        out.append(
            f"When working on {topic}, {verbs[(i * 7 + len(topic)) % len(verbs)]} "
            f"{things[(i * 3 + len(topic)) % len(things)]} before step {i % 13 + 1}."
        )
    return " ".join(out)


def schema(properties, required):
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


STR = {"type": "string"}
# Name, its parameters, the required ones: the tool set of a coding agent.
TOOL_SHAPES = [
    ("Task", {"description": STR, "prompt": STR, "subagent_type": STR}, ["description", "prompt"]),
    ("Bash", {"command": STR, "timeout": {"type": "number"}, "run_in_background": {"type": "boolean"}}, ["command"]),
    ("Glob", {"pattern": STR, "path": STR}, ["pattern"]),
    ("Grep", {"pattern": STR, "path": STR, "glob": STR, "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]}, "-n": {"type": "boolean"}, "head_limit": {"type": "number"}}, ["pattern"]),
    ("Read", {"file_path": STR, "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"]),
    ("Edit", {"file_path": STR, "old_string": STR, "new_string": STR, "replace_all": {"type": "boolean", "default": False}}, ["file_path", "old_string", "new_string"]),
    ("MultiEdit", {"file_path": STR, "edits": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {"old_string": STR, "new_string": STR, "replace_all": {"type": "boolean"}}, "required": ["old_string", "new_string"], "additionalProperties": False}}}, ["file_path", "edits"]),
    ("Write", {"file_path": STR, "content": STR}, ["file_path", "content"]),
    ("NotebookEdit", {"notebook_path": STR, "cell_id": STR, "new_source": STR, "edit_mode": {"type": "string", "enum": ["replace", "insert", "delete"]}}, ["notebook_path", "new_source"]),
    ("WebFetch", {"url": {"type": "string", "format": "uri"}, "prompt": STR}, ["url", "prompt"]),
    ("WebSearch", {"query": {"type": "string", "minLength": 2}, "allowed_domains": {"type": "array", "items": STR}}, ["query"]),
    ("TodoWrite", {"todos": {"type": "array", "items": {"type": "object", "properties": {"content": {"type": "string", "minLength": 1}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}, "activeForm": STR}, "required": ["content", "status", "activeForm"], "additionalProperties": False}}}, ["todos"]),
    ("BashOutput", {"bash_id": STR, "filter": STR}, ["bash_id"]),
    ("KillShell", {"shell_id": STR}, ["shell_id"]),
    ("ExitPlanMode", {"plan": STR}, ["plan"]),
    ("SlashCommand", {"command": STR}, ["command"]),
]


def anthropic_tools():
    return [
        {"name": name, "description": guidance(name, 40), "input_schema": schema(props, req)}
        for name, props, req in TOOL_SHAPES
    ]


def openai_tools():
    return [
        {"type": "function", "function": {"name": name, "description": guidance(name, 30), "parameters": schema(props, req)}}
        for name, props, req in TOOL_SHAPES
    ]


def claude_code_body(max_tokens, stream):
    reminder = "<system-reminder>\n" + guidance("reminders", 20) + "\n</system-reminder>"
    return dict(
        model=MODEL,
        max_tokens=max_tokens,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.0.abc; cc_entrypoint=cli; cch=1f2e3;"},
            {"type": "text", "text": "You are an interactive coding agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": guidance("software tasks", 400), "cache_control": {"type": "ephemeral"}},
        ],
        tools=anthropic_tools(),
        messages=[
            {"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": "Why does the build fail?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me run the build."},
                    {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "cargo build 2>&1 | tail -20"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": [{"type": "text", "text": "error[E0425]: cannot find value `x`"}]},
                    {"type": "text", "text": reminder, "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        metadata={"user_id": "user_0123_account__session_4567"},
        temperature=1,
        stream=stream,
    )


def post(server, path, body, headers):
    req = urllib.request.Request(
        server.base + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
    )
    return urllib.request.urlopen(req, timeout=300)


CLAUDE_HEADERS = {
    "x-api-key": KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
    "anthropic-dangerous-direct-browser-access": "true",
    "x-app": "cli",
    "user-agent": "claude-cli/2.0.0 (external, cli)",
}


def test_a_claude_code_shaped_stream_is_answered_in_anthropic_events(server):
    # The beta query, the headers and 32,000 output tokens asked for, as the
    # client sends them; the client stops reading after a few events (as a
    # user pressing Esc does), and the server must carry on regardless.
    with post(server, "/v1/messages?beta=true", claude_code_body(32000, True), CLAUDE_HEADERS) as r:
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        first = []
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("event: "):
                first.append(line[7:])
            if len(first) >= 6:
                break
    assert first[0] == "message_start" and "content_block_start" in first

    # The same request to its end at a smaller max_tokens, through the client.
    client = anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=300)
    body = claude_code_body(48, True)
    # This SDK version takes neither as an argument; they go in the body.
    extra = {"temperature": body.pop("temperature"), "stream": body.pop("stream")}
    with client.messages.stream(
        **body,
        extra_body=extra,
        extra_headers={k: v for k, v in CLAUDE_HEADERS.items() if k not in ("x-api-key", "anthropic-version")},
        extra_query={"beta": "true"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert final.usage.output_tokens > 0
    # The system prompt and tools were read whole: over 10,000 tokens, and
    # the second request found the first one's prefix in the cache (the
    # billing line does not break it).
    total = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert total > 10000, final.usage
    assert (final.usage.cache_read_input_tokens or 0) > 10000, final.usage
    for block in final.content:
        if block.type == "tool_use":
            assert block.name in {name for name, _, _ in TOOL_SHAPES}

    count = client.messages.count_tokens(
        model=MODEL, system=body["system"], tools=body["tools"], messages=body["messages"]
    )
    assert count.input_tokens == total


def test_a_claude_code_shaped_request_with_thinking_and_no_stream(server):
    body = claude_code_body(32, False)
    body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    # Extended thinking requires temperature 1, which the body has.
    with post(server, "/v1/messages?beta=true", body, CLAUDE_HEADERS) as r:
        msg = json.load(r)
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert {b["type"] for b in msg["content"]} <= {"thinking", "text", "tool_use"}
    assert isinstance(msg["usage"]["input_tokens"], int) and msg["usage"]["output_tokens"] > 0


def qwen_code_body():
    return dict(
        model=MODEL,
        messages=[
            {"role": "system", "content": guidance("a command-line coding assistant", 350)},
            {"role": "user", "content": "List the Rust files and fix the failing test."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "Glob", "arguments": json.dumps({"pattern": "**/*.rs"})}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "src/main.rs\nsrc/lib.rs\ntests/it.rs"},
            {"role": "user", "content": guidance("the failing test", 10)},
        ],
        tools=openai_tools(),
        tool_choice="auto",
        temperature=0,
        top_p=0.8,
        max_tokens=40,
    )


def test_a_qwen_code_shaped_chat_stream_with_usage(server):
    client = server.client(api_key=KEY)
    body = qwen_code_body()
    chunks = list(
        client.chat.completions.create(
            **body,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"user-agent": "QwenCode/0.1.0 (linux; x64)"},
            extra_body={"metadata": {"sessionId": "s-1", "promptId": "p-1"}},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 8000, usage
    assert all(not c.choices or c.choices[0].index == 0 for c in chunks)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("stop", "length", "tool_calls")
    names = {name for name, _, _ in TOOL_SHAPES}
    for c in chunks:
        for call in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if call.function and call.function.name:
                assert call.function.name in names

    # Not streamed: the same answer (greedy), the prompt served from the cache.
    again = client.chat.completions.create(**body)
    def joined(field):
        return "".join(getattr(c.choices[0].delta, field, None) or "" for c in chunks if c.choices)

    message = again.choices[0].message
    if not message.tool_calls:
        # Thinking is on: what the model wrote before `</think>` is reasoning.
        assert joined("content") + joined("reasoning_content"), "the stream carried text"
        assert (message.content or "") == joined("content")
        assert (getattr(message, "reasoning_content", None) or "") == joined("reasoning_content")
    assert again.usage.prompt_tokens == usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens > 8000

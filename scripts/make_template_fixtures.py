#!/usr/bin/env python3
"""Render reference chat-template cases with Hugging Face transformers.

Each conversation is rendered by `PreTrainedTokenizerFast.apply_chat_template`
(tokenize=False) on a tokenizer built from the tokenizer.json and
tokenizer_config.json that scripts/build_qwen_tokenizer.py writes, so the
expected strings carry everything transformers passes to the template
(special tokens, tools, kwargs). Cases whose template raises record the
exception message instead.

Usage:
  python3 scripts/make_template_fixtures.py TOKENIZER_DIR [OUT_JSON]
(default OUT_JSON: testdata/chat_template/qwen3_6_cases.json in this repository)
"""

import json
import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search files in a repository.\nReturns matching paths & line numbers <max 100>.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "extensions": {"type": "array", "items": {"type": "string"}},
                        "max_size_kb": {"type": "number", "minimum": 0.5, "maximum": 1e6},
                        "modified": {
                            "type": "object",
                            "properties": {"after": {"type": "string", "format": "date-time"}, "before": {"type": "string"}},
                        },
                    },
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                "mode": {"anyOf": [{"type": "string", "const": "regex"}, {"type": "null"}]},
            },
            "required": ["query"],
        },
    },
}

TRANSLATE_TOOL = {
    "type": "function",
    "function": {
        "name": "translate",
        "description": "Traduire un texte — 翻译文本 — テキストを翻訳する 🌍",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "target": {"type": "string"}},
            "required": ["text", "target"],
        },
    },
}

RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run Python code and return stdout.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "timeout_s": {"type": "number"}, "env": {"type": "object"}},
            "required": ["code"],
        },
    },
}


def call(name, arguments, call_id=None, wrap=True):
    if not wrap:
        return {"name": name, "arguments": arguments}
    tc = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id:
        tc["id"] = call_id
    return tc


def cases():
    out = []

    def add(name, messages, tools=None, add_generation_prompt=True, **kwargs):
        out.append(
            {
                "name": name,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": add_generation_prompt,
                "kwargs": kwargs,
            }
        )

    add("single_user", [{"role": "user", "content": "Hello!"}])
    add("single_user_no_generation_prompt", [{"role": "user", "content": "Hello!"}], add_generation_prompt=False)
    add(
        "system_and_user",
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
    )
    add(
        "system_whitespace_trimmed",
        [{"role": "system", "content": "\n  Be concise.  \n\n"}, {"role": "user", "content": "  padded question \t\n"}],
    )
    add("thinking_disabled", [{"role": "user", "content": "Quick answer please."}], enable_thinking=False)
    add("thinking_enabled_explicit", [{"role": "user", "content": "Think hard."}], enable_thinking=True)
    add(
        "multi_turn",
        [
            {"role": "system", "content": "You are Kestrel."},
            {"role": "user", "content": "Hi, who are you?"},
            {"role": "assistant", "content": "I am Kestrel, a helpful assistant."},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the tokenizer split up? It needed space."},
            {"role": "user", "content": "Another one, in 中文 please 😀"},
        ],
    )
    add(
        "multi_turn_reasoning_history",
        [
            {"role": "user", "content": "What is 17*23?"},
            {"role": "assistant", "content": "17*23 = 391.", "reasoning_content": "17*20=340, 17*3=51, 340+51=391."},
            {"role": "user", "content": "And 391/17?"},
        ],
    )
    add(
        "reasoning_in_last_turn_kept",
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "\nThe user wants a greeting.\n"},
        ],
        add_generation_prompt=False,
    )
    add(
        "think_tags_inside_content",
        [
            {"role": "user", "content": "Question one"},
            {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nOld answer."},
            {"role": "user", "content": "Question two"},
            {"role": "assistant", "content": "<think>\nnew reasoning\n</think>\n\nNew answer."},
        ],
        add_generation_prompt=False,
    )
    add(
        "preserve_thinking",
        [
            {"role": "user", "content": "First"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Second"},
        ],
        preserve_thinking=True,
    )
    add(
        "tools_no_system",
        [{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER_TOOL],
    )
    add(
        "tools_with_system_nested_schemas",
        [
            {"role": "system", "content": "You are a coding agent. Use tools when needed."},
            {"role": "user", "content": "Find TODOs in *.rs files changed after 2026-01-01."},
        ],
        tools=[WEATHER_TOOL, SEARCH_TOOL, TRANSLATE_TOOL, RUN_TOOL],
    )
    add(
        "single_tool_call_and_result",
        [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"}, "call_1")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "tool_call_with_content_and_reasoning",
        [
            {"role": "user", "content": "Weather in Tokyo and Oslo?"},
            {
                "role": "assistant",
                "content": "Let me check both cities.",
                "reasoning_content": "Two cities, two calls.",
                "tool_calls": [
                    call("get_weather", {"city": "Tokyo"}, "call_a"),
                    call("get_weather", {"city": "Oslo", "unit": "fahrenheit"}, "call_b"),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "Sunny, 25C"},
            {"role": "tool", "tool_call_id": "call_b", "content": "Snow, 28F"},
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "tool_call_nested_arguments",
        [
            {"role": "user", "content": "Search for unsafe blocks."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call(
                        "search_files",
                        {
                            "query": "unsafe {",
                            "filters": {"extensions": [".rs", ".c"], "max_size_kb": 512.5, "modified": {"after": "2026-01-01T00:00:00Z"}},
                            "limit": 20,
                            "mode": None,
                            "exact": True,
                        },
                    )
                ],
            },
            {"role": "tool", "content": "src/lib.rs:10\nsrc/ffi.rs:88"},
            {"role": "assistant", "content": "Found two unsafe blocks."},
            {"role": "user", "content": "Thanks"},
        ],
        tools=[SEARCH_TOOL],
    )
    add(
        "tool_call_multiline_quotes_unicode",
        [
            {"role": "user", "content": "Run this and translate the output."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "run_python",
                        {
                            "code": "print(\"héllo\")\nfor i in range(3):\n    print('line', i, \"\\t\")\n",
                            "timeout_s": 2.0,
                            "env": {"LANG": "ja_JP.UTF-8", "NOTE": "引用 \"quoted\" <tag> & 'apos' \u2028"},
                        },
                    ),
                    call("translate", {"text": "Grüße aus Köln 👋\nZweite Zeile", "target": "zh"}, wrap=False),
                ],
            },
            {"role": "tool", "content": "héllo\nline 0 \t\nline 1 \t\nline 2 \t"},
            {"role": "tool", "content": "来自科隆的问候 👋\n第二行"},
            {"role": "tool", "content": "  third result with padding  "},
        ],
        tools=[RUN_TOOL, TRANSLATE_TOOL],
    )
    add(
        "empty_arguments_tool_call",
        [
            {"role": "user", "content": "Ping"},
            {"role": "assistant", "content": "", "tool_calls": [call("ping", {})]},
            {"role": "tool", "content": "pong"},
            {"role": "user", "content": "ok"},
        ],
        tools=[{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}],
        enable_thinking=False,
    )
    add(
        "agent_loop_multi_step",
        [
            {"role": "system", "content": "Agent mode."},
            {"role": "user", "content": "Compute weather stats."},
            {"role": "assistant", "content": "", "reasoning_content": "step 1", "tool_calls": [call("get_weather", {"city": "Rome"})]},
            {"role": "tool", "content": "30C"},
            {"role": "assistant", "content": "", "reasoning_content": "step 2", "tool_calls": [call("get_weather", {"city": "Lima"})]},
            {"role": "tool", "content": "18C"},
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "tool_response_inside_user_message",
        [
            {"role": "user", "content": "Original question"},
            {"role": "assistant", "content": "Calling.", "reasoning_content": "need data", "tool_calls": [call("get_weather", {"city": "Nice"})]},
            {"role": "user", "content": "<tool_response>\nwarm\n</tool_response>"},
        ],
        tools=[WEATHER_TOOL],
    )
    add(
        "content_parts_text",
        [
            {"role": "system", "content": [{"type": "text", "text": "System from parts."}]},
            {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
        ],
    )
    add(
        "content_parts_image_placeholder",
        [{"role": "user", "content": [{"type": "image", "image": "file.png"}, {"type": "text", "text": "What is in this image?"}]}],
        add_vision_id=True,
    )
    add(
        "numbers_and_floats_in_arguments",
        [
            {"role": "user", "content": "Numbers"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("calc", {"a": 1, "b": -2.5, "c": 1e-7, "d": 1e16, "e": 123456789012345, "f": [0.1, 2.0, 3], "g": False, "h": None})],
            },
        ],
        tools=[{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {"x": {"type": "number", "default": 0.0001}}}}}],
        add_generation_prompt=False,
    )
    add(
        "extra_kwargs_ignored",
        [{"role": "user", "content": "hello"}],
        custom_flag="anything",
        enable_thinking=True,
    )
    # Error cases: the template raises, and both sides must report the message.
    add("error_system_not_first", [{"role": "user", "content": "hi"}, {"role": "system", "content": "late system"}])
    add("error_no_user_query", [{"role": "system", "content": "only system"}])
    add("error_unknown_role", [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}])
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    repo_root = Path(__file__).resolve().parent.parent
    tok_dir = Path(sys.argv[1])
    out_path = Path(sys.argv[2]) if len(sys.argv) > 2 else repo_root / "testdata" / "chat_template" / "qwen3_6_cases.json"
    config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"),
        eos_token=config["eos_token"],
        pad_token=config["pad_token"],
    )
    template = config["chat_template"]
    results = []
    for case in cases():
        try:
            rendered = tok.apply_chat_template(
                case["messages"],
                tools=case["tools"],
                add_generation_prompt=case["add_generation_prompt"],
                tokenize=False,
                chat_template=template,
                **case["kwargs"],
            )
            case["expected"] = rendered
        except Exception as e:  # the template's raise_exception
            case["expected_error"] = str(e)
        results.append(case)
    doc = {
        "source": "transformers PreTrainedTokenizerFast.apply_chat_template(tokenize=False) with the Qwen3.6 chat template",
        "special_tokens": {"eos_token": config["eos_token"], "pad_token": config["pad_token"]},
        "cases": results,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in results if "expected_error" in c)
    print(f"{len(results)} cases ({n_err} expected errors) -> {out_path}")


if __name__ == "__main__":
    main()

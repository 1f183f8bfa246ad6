//! Reasoning split: streamed in any chunking == non-streamed.

mod common;

use kestrel_api::reasoning::{ReasoningParser, prompt_opens_reasoning, split_reasoning};

/// Streams `chunks` and returns (reasoning, content).
fn stream(starts_in_reasoning: bool, chunks: &[String]) -> (String, String) {
    let mut p = ReasoningParser::new(starts_in_reasoning);
    let (mut r, mut c) = (String::new(), String::new());
    for chunk in chunks {
        let d = p.push(chunk);
        r.push_str(&d.reasoning);
        c.push_str(&d.content);
    }
    let d = p.finish();
    r.push_str(&d.reasoning);
    c.push_str(&d.content);
    (r, c)
}

#[track_caller]
fn check(starts_in_reasoning: bool, text: &str, reasoning: &str, content: &str) {
    for chunks in common::chunkings(text) {
        assert_eq!(
            stream(starts_in_reasoning, &chunks),
            (reasoning.to_string(), content.to_string()),
            "chunks {chunks:?}"
        );
    }
    let (r, c) = split_reasoning(starts_in_reasoning, text);
    assert_eq!(r.unwrap_or_default(), reasoning);
    assert_eq!(c.unwrap_or_default(), content);
}

#[test]
fn prompt_with_open_think_starts_in_reasoning() {
    check(
        true,
        "Let me think.\n</think>\n\nThe answer is 4.",
        "Let me think.",
        "The answer is 4.",
    );
    check(
        true,
        "\nstep 1\n\nstep 2\n\n</think>\n\nok",
        "step 1\n\nstep 2",
        "ok",
    );
}

#[test]
fn model_emitted_think_opens_reasoning_at_start() {
    check(false, "<think>\nhmm\n</think>\n\nHi!", "hmm", "Hi!");
    check(false, "\n<think>a</think>b", "a", "b");
}

#[test]
fn content_only_when_thinking_disabled() {
    check(false, "Hello, world.", "", "Hello, world.");
    // A `<think>` later in content is just text.
    check(
        false,
        "Use the <think> tag like this.",
        "",
        "Use the <think> tag like this.",
    );
    check(false, "<thin", "", "<thin");
    check(false, "", "", "");
}

#[test]
fn tool_call_inside_reasoning_ends_it() {
    let text = "I should call a tool.\n<tool_call>\n{\"name\":\"f\"}\n</tool_call>";
    check(
        true,
        text,
        "I should call a tool.",
        "<tool_call>\n{\"name\":\"f\"}\n</tool_call>",
    );
}

#[test]
fn unterminated_reasoning_stays_reasoning() {
    check(true, "thinking forever </thi", "thinking forever </thi", "");
    check(true, "a\n\n", "a", "");
}

#[test]
fn partial_tags_and_multibyte_text() {
    check(true, "日本語の推論</think>答え", "日本語の推論", "答え");
    check(true, "a < b </ c</think>x", "a < b </ c", "x");
    check(
        true,
        "<tool_ca is not a tag</think>y",
        "<tool_ca is not a tag",
        "y",
    );
}

#[test]
fn start_state_from_prompt() {
    let qwen35_thinking = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let qwen35_no_thinking =
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    let qwen3_plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    let history_with_open_think_in_user =
        "<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n";
    assert!(prompt_opens_reasoning(qwen35_thinking));
    assert!(!prompt_opens_reasoning(qwen35_no_thinking));
    assert!(!prompt_opens_reasoning(qwen3_plain));
    assert!(!prompt_opens_reasoning(history_with_open_think_in_user));
    assert!(ReasoningParser::from_prompt(qwen35_thinking).in_reasoning());
    assert!(!ReasoningParser::from_prompt(qwen35_no_thinking).in_reasoning());
}

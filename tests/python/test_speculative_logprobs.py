"""Logprobs through the official openai client are identical with
speculative decoding on (n-gram drafts, the MTP head) and off: the chosen
tokens, their logprobs and the top alternatives, bit for bit, on chat and
completions, streamed and not, greedy and seeded sampling. The speculative
servers must have drafted and accepted tokens, or the comparison proves
nothing.
"""

import urllib.request

import pytest

from test_openai_client import MODEL, Server

SPECULATION = {
    "ngram": ("--speculative", "ngram", "--num-speculative-tokens", "3"),
    "mtp": ("--speculative", "mtp", "--num-speculative-tokens", "2"),
}

# Repetitive code, so prompt lookup finds matches to draft from.
PROMPT = "def f0(x):\n    return x + 0\n\ndef f1(x):\n    return x + 1\n\ndef f2(x):\n    return x + 2\n\ndef f3(x):\n"

CASES = {
    "greedy": dict(temperature=0),
    "seeded": dict(temperature=0.9, top_p=0.95, seed=17),
}


@pytest.fixture(scope="module")
def servers():
    started = {"off": Server()}
    try:
        for name, args in SPECULATION.items():
            started[name] = Server(*args)
        yield started
    finally:
        for s in started.values():
            s.stop()


def chat_logprobs(server, case, stream):
    args = dict(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=40,
        logprobs=True,
        top_logprobs=5,
        # vLLM's min_tokens: the end-of-sequence token is masked until 40,
        # so every answer is long enough to draft in (and the mask is
        # applied to verified rows too).
        extra_body={"min_tokens": 40},
        **CASES[case],
    )
    client = server.client()
    if not stream:
        r = client.chat.completions.create(**args)
        return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in r.choices[0].logprobs.content]
    out = []
    for chunk in client.chat.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            out += [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in chunk.choices[0].logprobs.content]
    return out


def completion_logprobs(server, case, stream):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=40, logprobs=5, extra_body={"min_tokens": 40}, **CASES[case])
    client = server.client()
    if not stream:
        lp = client.completions.create(**args).choices[0].logprobs
        return list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    out = []
    for chunk in client.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            lp = chunk.choices[0].logprobs
            out += list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    return out


def accepted_drafts(server):
    with urllib.request.urlopen(f"{server.base}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                return float(line.split()[-1])
    raise AssertionError("no accepted-drafts counter")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", list(SPECULATION))
def test_chat_logprobs_equal_with_speculation_on_and_off(servers, method, case, stream):
    off = chat_logprobs(servers["off"], case, stream)
    assert len(off) == 40
    assert chat_logprobs(servers[method], case, stream) == off


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", list(SPECULATION))
def test_completion_logprobs_equal_with_speculation_on_and_off(servers, method, case, stream):
    off = completion_logprobs(servers["off"], case, stream)
    assert len(off) == 40
    assert completion_logprobs(servers[method], case, stream) == off


def test_the_speculative_servers_accepted_drafts(servers):
    # Runs after the comparisons (pytest keeps file order).
    for method in SPECULATION:
        assert accepted_drafts(servers[method]) > 0, method
    assert accepted_drafts(servers["off"]) == 0

#!/usr/bin/env bash
# Runs the real Claude Code and Qwen Code command-line agents against
# `kestrel serve`, non-interactively, and checks that every request they
# send is answered: each CLI must exit 0, and the server must answer no
# request with a 5xx or an unexpected 4xx. Prints a summary of the runs and
# of the routes the CLIs called (see docs/agents.md).
#
# NOT run by CI: it downloads both CLIs from npm (pinned versions below) and,
# on a CPU, takes half an hour or so (the prompts of these agents are 15-20K
# tokens). It needs bash, curl, python3, node and npm (Qwen Code asks for
# Node 22; Claude Code ships a native binary).
#
# The bundled model is served with a 64K context (Claude Code asks for
# 32,000 output tokens); it was trained on 4K tokens, so what it writes is
# noise: the run checks the API, not the answers. Its noise rarely ends by
# itself, and Claude Code gives up with an error after an answer has run to
# the output limit three times over; so by default the server runs a copy of
# the bundled model that ends every answer at its first line break (each
# token that holds a newline is one of its end-of-sequence tokens). The
# requests, tools and streams stay the CLIs' own; only the answers are short
# (and so tool calls, which take several lines, do not happen).
#
#   scripts/agent-cli-smoke.sh
#
# Environment:
#   KESTREL_BIN          server binary (default: target/release/kestrel)
#   CLAUDE_CODE_VERSION  @anthropic-ai/claude-code version (default below)
#   QWEN_CODE_VERSION    @qwen-code/qwen-code version (default below)
#   SHORT_ANSWERS=0      serve the bundled model as it is
#   MAX_OUTPUT_TOKENS    cap on each CLI request's output tokens (default 0:
#                        the CLIs' own, 32,000 for Claude Code and 32,768
#                        for Qwen Code)
#   CLI_TIMEOUT          seconds a CLI run may take (default 1200)
#   KEEP_WORKDIR=1       keep the temporary folder (logs, request bodies)
#
# Claude Code's first run leaves its nonessential traffic on (telemetry,
# error reports and updates stay off), so that it sends its `/api/hello`
# probe to the server; it may then also try to reach Anthropic's own hosts.
set -euo pipefail

CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
QWEN_CODE_VERSION=${QWEN_CODE_VERSION:-0.24.4}
MAX_OUTPUT_TOKENS=${MAX_OUTPUT_TOKENS:-0}
CLI_TIMEOUT=${CLI_TIMEOUT:-1200}
CONTEXT=65536
MODEL=qwen
KEY=smoke-key

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${KESTREL_BIN:-$root/target/release/kestrel}
[[ -x $bin ]] || { echo "no server binary at $bin (build it or set KESTREL_BIN)" >&2; exit 2; }
for tool in curl python3 node npm timeout; do
    command -v "$tool" > /dev/null || { echo "$tool is required" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-agents.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2> /dev/null || true
    done
    wait 2> /dev/null || true
    if [[ ${KEEP_WORKDIR:-0} == 1 ]]; then
        echo "kept $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

echo "== installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION and @qwen-code/qwen-code@$QWEN_CODE_VERSION"
npm install --prefix "$work/npm" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@qwen-code/qwen-code@$QWEN_CODE_VERSION" \
    > "$work/npm.log" 2>&1 || { cat "$work/npm.log" >&2; exit 2; }
claude=$work/npm/node_modules/.bin/claude
qwen=$work/npm/node_modules/.bin/qwen
echo "claude $("$claude" --version 2>/dev/null | head -1); qwen $("$qwen" --version 2>/dev/null | head -1)"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
server_port=$(free_port)
proxy_port=$(free_port)

model_args=()
if [[ ${SHORT_ANSWERS:-1} == 1 ]]; then
    bundled=$root/models/kestrel-tiny-qwen35
    mkdir "$work/model"
    ln -s "$bundled"/* "$work/model/"
    rm "$work/model/config.json"
    python3 - "$bundled" "$work/model" << 'EOF'
import json, sys

src, dst = sys.argv[1:]
config = json.load(open(f"{src}/config.json"))
vocab = json.load(open(f"{src}/tokenizer.json"))["model"]["vocab"]
# Byte-level BPE writes a newline as U+010A.
breaks = sorted(i for token, i in vocab.items() if "\u010a" in token)
holders = [c for c in (config, config.get("text_config") or {}) if "eos_token_id" in c]
if not holders:
    sys.exit("config.json has no eos_token_id")
eos = holders[0]["eos_token_id"]
holders[0]["eos_token_id"] = (eos if isinstance(eos, list) else [eos]) + breaks
json.dump(config, open(f"{dst}/config.json", "w"), indent=1)
EOF
    model_args=(--model "$work/model")
fi

echo "== starting $bin serve on port $server_port"
"$bin" serve "${model_args[@]}" --port "$server_port" --api-key "$KEY" --served-model-name "$MODEL" \
    --max-model-len "$CONTEXT" --allow-long-max-model-len > "$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$server_port/health" > /dev/null && break
    kill -0 "${pids[0]}" 2> /dev/null || { cat "$work/server.log" >&2; exit 2; }
    sleep 0.5
done
curl -sf "http://127.0.0.1:$server_port/health" > /dev/null || { echo "the server did not come up" >&2; exit 2; }

# A logging proxy between the CLIs and the server: one JSON line per request
# (route, body size, tools, stream flag, max_tokens, status, the error
# message of a 4xx/5xx); bodies are kept as files.
cat > "$work/proxy.py" << 'EOF'
import http.client, http.server, json, os, socketserver, sys, threading, time

listen, upstream, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
log = open(os.path.join(out, "requests.jsonl"), "a", buffering=1)
lock = threading.Lock()
count = [0]
HOP = {"host", "connection", "accept-encoding", "content-length", "transfer-encoding"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        with lock:
            count[0] += 1
            n = count[0]
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            run = open(os.path.join(out, "current-run")).read().strip()
        except OSError:
            run = "?"
        entry = {"n": n, "run": run, "method": self.command, "path": self.path.split("?")[0],
                 "query": self.path.partition("?")[2], "bytes": len(body),
                 "user_agent": self.headers.get("user-agent", "")}
        if body:
            open(os.path.join(out, f"request-{n:03d}.json"), "wb").write(body)
            try:
                j = json.loads(body)
                entry.update(stream=j.get("stream"), tools=len(j.get("tools") or []),
                             max_tokens=j.get("max_tokens") or j.get("max_output_tokens"),
                             messages=len(j.get("messages") or j.get("input") or []))
            except (ValueError, AttributeError):
                entry["json"] = False
        started = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=3600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            entry.update(status=502, error=f"proxy: {e}")
            log.write(json.dumps(entry) + "\n")
            self.send_response(502)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        entry["status"] = resp.status
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        chunked = self.command != "HEAD"
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", resp.getheader("content-length") or "0")
        self.end_headers()
        kept = b""
        try:
            while chunk := resp.read1(65536):
                if len(kept) < 4096:
                    kept += chunk[:4096]
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            entry["client_left"] = True
        if resp.status >= 400:
            try:
                e = json.loads(kept)["error"]
                entry["error"] = e.get("message") if isinstance(e, dict) else str(e)
            except (ValueError, KeyError, TypeError):
                entry["error"] = kept[:300].decode(errors="replace")
        entry["seconds"] = round(time.time() - started, 1)
        log.write(json.dumps(entry) + "\n")

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


Server(("127.0.0.1", listen), Handler).serve_forever()
EOF
mkdir -p "$work/requests"
python3 "$work/proxy.py" "$proxy_port" "$server_port" "$work/requests" 2> "$work/proxy.log" &
pids+=($!)
for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$proxy_port/health" && break
    sleep 0.2
done
base=http://127.0.0.1:$proxy_port

# A small project for the agents to look at.
project=$work/project
mkdir -p "$project/src"
printf 'fn main() {\n    println!("hello");\n}\n' > "$project/src/main.rs"
printf '# demo\n\nA demo project.\n' > "$project/README.md"

# Fresh homes: no configuration of this machine's user leaks in.
mkdir -p "$work/home-claude" "$work/home-qwen/.qwen"
qwen_sampling=""
if [[ $MAX_OUTPUT_TOKENS != 0 ]]; then
    qwen_sampling=", \"samplingParams\": {\"max_tokens\": $MAX_OUTPUT_TOKENS}"
fi
cat > "$work/home-qwen/.qwen/settings.json" << EOF
{
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "general": {"enableAutoUpdate": false},
  "model": {"name": "$MODEL", "generationConfig": {"contextWindowSize": $CONTEXT$qwen_sampling}}
}
EOF

results=()
run() { # NAME COMMAND...: runs one CLI in the project, records its exit status
    local name=$1 rc=0 start=$SECONDS
    shift
    echo "== $name"
    echo "$name" > "$work/requests/current-run"
    (cd "$project" && timeout "$CLI_TIMEOUT" "$@" < /dev/null > "$work/$name.out" 2> "$work/$name.err") || rc=$?
    # A stream-json or json result can report an error with exit status 0.
    if [[ $rc == 0 ]] && grep -q '"is_error":true' "$work/$name.out"; then
        rc=99
    fi
    results+=("$name $rc $((SECONDS - start))")
    echo "   exit $rc after $((SECONDS - start)) s"
    if [[ $rc != 0 ]]; then
        tail -c 1500 "$work/$name.err" | sed 's/^/   | /'
        tail -c 1500 "$work/$name.out" | sed 's/^/   | /'
    fi
}

claude_env=(env HOME="$work/home-claude" ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY="$KEY"
    ANTHROPIC_MODEL="$MODEL" ANTHROPIC_SMALL_FAST_MODEL="$MODEL"
    ANTHROPIC_DEFAULT_HAIKU_MODEL="$MODEL" ANTHROPIC_DEFAULT_SONNET_MODEL="$MODEL"
    ANTHROPIC_DEFAULT_OPUS_MODEL="$MODEL"
    DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1)
if [[ $MAX_OUTPUT_TOKENS != 0 ]]; then
    claude_env+=(CLAUDE_CODE_MAX_OUTPUT_TOKENS="$MAX_OUTPUT_TOKENS")
fi
quiet=(CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1)
no_thinking=(--settings '{"alwaysThinkingEnabled": false}')

run claude-text "${claude_env[@]}" "$claude" -p "say hi" "${no_thinking[@]}"
run claude-stream-json "${claude_env[@]}" "${quiet[@]}" "$claude" -p "list the files here" \
    --output-format stream-json --verbose --include-partial-messages
run claude-json "${claude_env[@]}" "${quiet[@]}" "$claude" -p "what does src/main.rs print?" \
    --output-format json "${no_thinking[@]}"

qwen_env=(env HOME="$work/home-qwen" QWEN_USAGE_STATISTICS_ENABLED=0
    OPENAI_BASE_URL="$base/v1" OPENAI_API_KEY="$KEY" OPENAI_MODEL="$MODEL"
    ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY="$KEY" ANTHROPIC_MODEL="$MODEL")
run qwen-chat "${qwen_env[@]}" "$qwen" --auth-type openai "say hi"
run qwen-chat-stream-json "${qwen_env[@]}" "$qwen" --auth-type openai "list the files here" \
    --output-format stream-json --include-partial-messages
run qwen-responses "${qwen_env[@]}" "$qwen" --auth-type openai-responses "say hi"
run qwen-messages "${qwen_env[@]}" "$qwen" --auth-type anthropic "say hi"

# Wait for the last streams to end (a CLI can leave one open as it exits).
sleep 2

echo
echo "== summary"
python3 - "$work/requests/requests.jsonl" "${results[@]}" << 'EOF'
import collections, json, sys

path, runs = sys.argv[1], sys.argv[2:]
entries = [json.loads(line) for line in open(path)] if runs else []
# A 4xx the CLI is meant to get: Claude Code raises max_tokens after a cut-off
# answer, reads the numbers of this message, and sends again what fits.
EXPECTED_4XX = ("input length and `max_tokens` exceed context limit",)
failed = False
print(f"{'run':24} {'exit':>4} {'seconds':>7}")
for r in runs:
    name, rc, secs = r.split()
    print(f"{name:24} {rc:>4} {secs:>7}")
    failed |= rc != "0"
routes = collections.defaultdict(list)
for e in entries:
    routes[(e["run"], e["method"], e["path"])].append(e)
print()
print(f"{'run':24} {'route':30} {'n':>3}  {'statuses':14} {'largest body':>12}  tools  stream  max_tokens")
order = {r.split()[0]: i for i, r in enumerate(runs)}
for (run, method, route), es in sorted(routes.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0])):
    statuses = collections.Counter(e.get("status") for e in es)
    status_text = ",".join(f"{s}x{c}" for s, c in sorted(statuses.items(), key=str))
    tools = sorted({e.get("tools") for e in es if e.get("tools") is not None})
    stream = sorted({str(e.get("stream")) for e in es if "stream" in e})
    max_tokens = sorted({e.get("max_tokens") for e in es if e.get("max_tokens")})
    print(f"{run:24} {method + ' ' + route:30} {len(es):>3}  {status_text:14} "
          f"{max(e['bytes'] for e in es):>12}  {','.join(map(str, tools)) or '-':5}  "
          f"{','.join(stream) or '-':6}  {','.join(map(str, max_tokens)) or '-'}")
bad = []
for e in entries:
    s = e.get("status") or 0
    if s >= 500 or (s >= 400 and not (e.get("error") or "").startswith(EXPECTED_4XX)):
        bad.append(e)
for e in bad:
    print(f"UNEXPECTED {e.get('status')} to {e['method']} {e['path']} in {e['run']} (request {e['n']}): {e.get('error')}")
if not entries:
    print("no requests reached the server")
failed |= bool(bad) or not entries
print()
print("FAILED" if failed else "OK: every CLI exited 0 and every request was answered")
sys.exit(1 if failed else 0)
EOF

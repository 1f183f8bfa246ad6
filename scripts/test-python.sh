#!/usr/bin/env bash
# Builds `kestrel` (release) and runs the Python tests, which start
# `kestrel serve` with the bundled model and talk to it with the official
# openai client (chat, completions, responses) and the anthropic client.
# Run scripts/setup-python.sh first.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p kestrel
KESTREL_BIN="$PWD/target/release/kestrel" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python "$@"

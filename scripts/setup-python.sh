#!/usr/bin/env bash
# Creates the git-ignored virtualenv .venv/ with the pinned packages the
# Python integration tests need (the official openai and anthropic clients, pytest, and jsonschema to check constrained output).
# Usage: scripts/setup-python.sh [python-interpreter]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    "openai==2.54.0" "anthropic==2.15.0" "pytest==9.0.2" "jsonschema==4.26.0"
.venv/bin/python -c "import openai, anthropic, pytest, jsonschema; from importlib.metadata import version; print('python test env: openai', openai.__version__, 'anthropic', anthropic.__version__, 'pytest', pytest.__version__, 'jsonschema', version('jsonschema'))"

#!/usr/bin/env bash
# Set up a development environment from nothing: a virtual environment at .venv/ with statesnap,
# its test extras and the Spark extra installed (so .venv/bin/statesnap and .venv/bin/moto_server
# exist). Needs Python >= 3.11 and pip; Java 17 for the Spark pipelines.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PYTHON="$candidate"; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: need Python >= 3.11" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,spark]'
echo "setup: ready — .venv/bin/statesnap --help" >&2

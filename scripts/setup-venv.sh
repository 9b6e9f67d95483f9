#!/usr/bin/env bash
# Creates .venv in the repo root if missing and installs NetSense with its dev extras, idempotently.
# torch==2.13.0 first: the CPU build on local disk (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.netsense-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import netsense, torch, aioquic" && touch "$stamp"
fi

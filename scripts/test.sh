#!/usr/bin/env bash
# The whole test suite, slow end-to-end runs included.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
cd "$root"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

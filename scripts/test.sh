#!/usr/bin/env bash
# The whole test suite, slow end-to-end runs included.
# Without arguments: two pytest-xdist workers (NETSENSE_TEST_WORKERS) run every test but those
# marked `serial`, which then run alone: their premise is the host's CPU alone (what a userspace
# link carries, what unshaped loopback costs), which a test beside them would change. With arguments:
# one serial pytest run with them (e.g. `-m "not slow"`, a file, `-k name`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
cd "$root"
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
status=0
"${pytest[@]}" -n "${NETSENSE_TEST_WORKERS:-2}" --dist worksteal -m "not serial" || status=$?
"${pytest[@]}" -m serial || status=$((status ? status : $?))
exit "$status"

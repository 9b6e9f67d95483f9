#!/usr/bin/env bash
# The main job: 1 parameter server + 2 workers over QUIC (TLS on) training digits-cnn.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
exec "$root/.venv/bin/netsense" launch "$@"

#!/usr/bin/env bash
# The main job: 1 parameter server + 2 workers over QUIC (TLS verified, HMAC-authenticated)
# training digits-cnn across an emulated 20 Mbit/s, 20 ms RTT link, with the adaptive policy
# choosing each push's codec, which the update comes back in (the gradient-domain downlink), so its
# choices are visible (progress bar, summary "levels", decision logs).
# Any arguments replace these defaults and go to `netsense launch` as they are.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
if [ "$#" -eq 0 ]; then
  set -- --link "rate=20mbit,delay=10ms,queue=50ms" --policy netsense \
         --run-dir "$root/runs/demo" --summary-json "$root/runs/demo/summary.json"
fi
exec "$root/.venv/bin/netsense" launch "$@"

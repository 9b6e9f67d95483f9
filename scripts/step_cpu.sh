#!/usr/bin/env bash
# CPU time per training step of each NetSense process (PS shards, workers, relays, the link
# emulator), measured over a window of a running `netsense bench scenario` job: where a step's CPU
# goes when the processes share the cores (docs/history/BENCHMARKS-2026.md, "One transmit per burst"). Linux
# only (reads /proc).
#
#   scripts/step_cpu.sh [--after S] [--window S] -- BENCH-SCENARIO-ARGS...
#
# Give the scenario one NetSense policy and enough --steps to outlast the window (e.g. --steps
# 1500); --out is required (the window's steps are counted from its rank 0 events). The job runs
# to its end; the script prints, for each of those processes, its user + system CPU over the
# window divided by the steps rank 0 finished in it, then the total.
set -euo pipefail
after=22
window=10
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --after) after="$2"; shift 2 ;;
    --window) window="$2"; shift 2 ;;
    *) echo "step_cpu.sh: unknown option $1 (usage: step_cpu.sh [--after S] [--window S] -- ARGS)" >&2; exit 2 ;;
  esac
done
[ "${1:-}" = "--" ] || { echo "step_cpu.sh: put the bench scenario arguments after --" >&2; exit 2; }
shift
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "--out" ] && out="$arg"
  prev="$arg"
done
[ -n "$out" ] || { echo "step_cpu.sh: the scenario needs --out DIR" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
netsense="${NETSENSE:-$root/.venv/bin/netsense}"

"$netsense" bench scenario "$@" > "$out.log" 2>&1 &
job=$!
trap 'kill "$job" 2>/dev/null || true' EXIT
sleep "$after"
snapshot() {  # pid, CPU ticks (utime + stime), role; of every `netsense ps|worker|relay|emulate` process
  for pid in $(pgrep -f -- "-m netsense (ps|worker|relay|emulate) " || true); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    role=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -oE "netsense (ps|worker|relay|emulate)" || true)
    echo "$pid $(echo "${stat##*) }" | awk '{print $12 + $13}') ${role#netsense }"
  done
}
before=$(snapshot)
t0=$(date +%s.%N)
sleep "$window"
after_snap=$(snapshot)
t1=$(date +%s.%N)
wait "$job" || { echo "step_cpu.sh: the scenario failed; see $out.log" >&2; exit 1; }
trap - EXIT
python3 - "$out" "$t0" "$t1" "$(getconf CLK_TCK)" "$before" "$after_snap" <<'PY'
import glob, json, sys

out, t0, t1, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def parse(text):
    rows = {}
    for line in text.splitlines():
        pid, ticks, role = line.split()
        rows[pid] = (int(ticks), role)
    return rows
before, after = parse(sys.argv[5]), parse(sys.argv[6])
events = glob.glob(f"{out}/runs/*/events.jsonl")
if len(events) != 1:
    sys.exit(f"step_cpu.sh: expected one NetSense run under {out}/runs, found {len(events)}")
steps = 0
for line in open(events[0]):
    e = json.loads(line)
    steps += e.get("event") == "step" and e.get("rank") == 0 and t0 <= e["t"] <= t1
if steps == 0:
    sys.exit("step_cpu.sh: no step finished in the window (start it later: --after, or more --steps)")
print(f"{steps} steps in {t1 - t0:.1f} s: {1000 * (t1 - t0) / steps:.2f} ms a step")
total = 0.0
for pid, (ticks, role) in sorted(after.items(), key=lambda kv: kv[1][1]):
    if pid in before:
        ms = 1000 * (ticks - before[pid][0]) / hz / steps
        total += ms
        print(f"{role:7s} pid {pid}: {ms:6.2f} ms CPU a step")
print(f"total:          {total:6.2f} ms CPU a step")
PY

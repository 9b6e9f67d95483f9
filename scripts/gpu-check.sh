#!/usr/bin/env bash
# GPU checks of the worker's device path, for a session lent a GPU machine (H200, 16 cores, no
# network, ~10 min per command). Two steps:
#
#   1. here, with PyPI:   bash scripts/gpu-check.sh prepare
#      Downloads into .whl/ (git-ignored) the cp312 wheels that the GPU image lacks (aioquic and its
#      TLS stack, pytest-asyncio). The image's python3 (3.12) already holds CUDA torch, numpy,
#      msgpack, uvloop, scikit-learn, pytest; our .venv (Python 3.11, CPU torch) cannot run there.
#   2. on the GPU machine: run(command="bash scripts/gpu-check.sh run", carry=[".whl"], timeout_s=600)
#      Results under $OUT: env.txt, gpu-check.log, tests.log, codecs-gpu.json, launch-cuda.json,
#      launch-cpu.json, steps.json (median step-time breakdown of both launches, side by side).
#
# `DEVICE=cpu bash scripts/gpu-check.sh run` runs the same steps on the CPU with this checkout's
# .venv (the CUDA tests then skip): a dry run of everything but the GPU. STEPS and NUMEL shorten it;
# PYTHON names another interpreter than the image's python3.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode="${1:-run}"
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-30}"
NUMEL="${NUMEL:-11000000}"
WHEELS=(aioquic==1.7.2 pylsqpack==1.0.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 pyOpenSSL==26.4.0
        service-identity==26.1.0 pyasn1 pyasn1-modules pytest-asyncio==1.5.0)

prepare() {
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
  ls -la .whl
}

# Sets PY: a Python with (CUDA) torch and every netsense dependency importable.
setup_python() {
  if [ "$DEVICE" = cpu ] && [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
    return
  fi
  PY="${PYTHON:-python3}"
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # The package maps netsense.{transport,compression,ps,worker} to top-level folders (pyproject);
  # without an installed copy, links inside this (throw-away) tree give the same layout.
  for d in transport compression ps worker; do
    [ -e "netsense/$d" ] || ln -s "../$d" "netsense/$d"
  done
  export PYTHONPATH="$root:${PYTHONPATH}"
}

step_times() {  # run dir -> median seconds per step and of each breakdown field (rank 0)
  "$PY" - "$@" <<'EOF'
import json, statistics, sys
out = {}
for run in sys.argv[1:]:
    events = [json.loads(l) for l in open(f"{run}/events.jsonl") if l.strip()]
    steps = [e for e in events if e.get("event") == "step" and e.get("rank", 0) == 0]
    walls = [b["wall_s"] - a["wall_s"] for a, b in zip(steps, steps[1:])][2:]  # skip warm-up steps
    fields = ("compute_s", "encode_s", "push_s", "wait_s", "decode_s", "apply_s")
    out[run.rsplit("/", 1)[-1]] = {
        "steps": len(steps), "median_step_s": statistics.median(walls) if walls else None,
        **{f: statistics.median(e[f] for e in steps[2:]) for f in fields if len(steps) > 2},
    }
print(json.dumps(out, indent=2))
EOF
}

run() {
  OUT="${OUT:-$root/gpu-check-out}"
  mkdir -p "$OUT"
  exec > >(tee "$OUT/gpu-check.log") 2>&1
  setup_python || { echo "cannot set up python (wheels missing? run 'prepare' first)"; exit 3; }
  export PYTHONUNBUFFERED=1
  failed=0
  {
    date -u; uptime; nproc; nvidia-smi 2>&1 | head -15
    "$PY" -c "import sys, torch, aioquic; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''); print('aioquic', aioquic.__version__)"
    git log -1 --format='commit %H %s' 2>/dev/null || true
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  if [ "$DEVICE" != cpu ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "no CUDA torch in $PY: nothing to check"; exit 3
  fi

  echo "== CUDA tests"
  timeout 300 "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/worker/test_device.py tests/worker/test_torch_optimizer.py > "$OUT/tests.log" 2>&1 || failed=1
  timeout 200 "$PY" -m pytest -q -rs -p no:cacheprovider -k cuda tests/compression >> "$OUT/tests.log" 2>&1 || failed=1
  tail -5 "$OUT/tests.log"

  echo "== codec bench on $DEVICE"
  timeout 200 "$PY" -m netsense bench codecs --device "$DEVICE" --numel "$NUMEL" --json "$OUT/codecs-gpu.json" || failed=1

  devices=("$DEVICE"); [ "$DEVICE" != cpu ] && devices+=(cpu)  # the GPU run, then the CPU beside it
  runs=()
  for dev in "${devices[@]}"; do
    name="launch-${dev//:/-}"  # $OUT names: letters, digits, '.', '_' and '-'
    echo "== $name: resnet18-synth x2 on $dev, $STEPS steps"
    rm -rf "/tmp/gpu-check/$name"
    timeout 240 "$PY" -m netsense launch --model resnet18-synth --workers 2 --device "$dev" --steps "$STEPS" \
      --eval-every 0 --no-progress --run-dir "/tmp/gpu-check/$name" --summary-json "$OUT/$name.json" || failed=1
    [ -f "/tmp/gpu-check/$name/events.jsonl" ] && runs+=("/tmp/gpu-check/$name")
  done
  [ "${#runs[@]}" -gt 0 ] && step_times "${runs[@]}" | tee "$OUT/steps.json"
  uptime
  echo "gpu-check: $([ "$failed" = 0 ] && echo all steps passed || echo SOME STEPS FAILED, see the logs)"
  exit "$failed"
}

# Issue #7's shard scaling (2 shards >= 1.6x the ingest of 1 with 4 workers) needs cores for every
# process (the 2-core development VM cannot show it): on the 16-core machine, as a second command,
#   run(command="bash scripts/gpu-check.sh shards", carry=[".whl"], timeout_s=300)
shards() {
  OUT="${OUT:-$root/gpu-check-out}"
  mkdir -p "$OUT"
  setup_python || { echo "cannot set up python (wheels missing? run 'prepare' first)"; exit 3; }
  { date -u; uptime; nproc; } | tee "$OUT/shards-env.txt"
  timeout 280 "$PY" -m netsense bench shards --servers 1,2 --workers 2,4,8 --mb 8 --steps 4 \
    --json "$OUT/shards.json" 2>&1 | tee "$OUT/shards.log"
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  shards) shards ;;
  *) echo "usage: $0 prepare|run|shards" >&2; exit 2 ;;
esac

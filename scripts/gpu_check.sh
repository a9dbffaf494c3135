#!/usr/bin/env bash
# GPU check: device, `jaxroute bench` at accelerator sizes, train-predictor on the GPU vs forced to CPU,
# and the test suite's fast subset -- all in under 10 minutes, each stage under its own time limit.
#
#   bash scripts/gpu_check.sh [--quick]  (from the repository root; no install: python3 + PYTHONPATH=.)
#
# --quick: every stage at tiny sizes (a smoke run of the same stages, on any machine; the tests run it).
#
# Needs jax (with CUDA), optax, orbax-checkpoint, tqdm, matplotlib and pytest; no network.
# Writes bench_*.json, bench.json (the parts merged), ckpt_*/ and gpu_check.log to $OUT when set,
# else to results/. BUDGET_S (default 570) caps the whole script; each stage gets at most its own
# limit and never more than what is left of the budget. LIMIT_SCALE (a whole number, default 1) multiplies
# every limit and the budget: the tests run --quick on a busy CPU, where the GPU run's limits do not apply.
set -uo pipefail

QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
[[ $# -gt 0 && $QUICK == 0 ]] && { echo "usage: bash scripts/gpu_check.sh [--quick]" >&2; exit 2; }
LIMIT_SCALE=${LIMIT_SCALE:-1}
[[ $LIMIT_SCALE =~ ^[1-9][0-9]*$ ]] || { echo "LIMIT_SCALE must be a positive whole number, got '$LIMIT_SCALE'" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export JAXROUTE_NO_PROGRESS=1
DEST=${OUT:-results}
mkdir -p "$DEST"
LOG=$DEST/gpu_check.log
exec > >(tee "$LOG") 2>&1
BUDGET_S=$(( ${BUDGET_S:-570} * LIMIT_SCALE ))
PY=${PYTHON:-python3}
STATUS=0

left() { echo $(( BUDGET_S - SECONDS )); }

# stage NAME LIMIT_S CMD...: run CMD under `timeout` (the smaller of LIMIT_S and the budget left).
stage() {
  local name=$1 limit=$(( $2 * LIMIT_SCALE )); shift 2
  local room; room=$(left)
  if (( room < 20 )); then
    echo "=== $name: skipped (${room}s of the budget left)"
    STATUS=1
    return 0
  fi
  (( limit > room )) && limit=$room
  echo "=== $name (limit ${limit}s, ${SECONDS}s elapsed)"
  local t0=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" || rc=$?
  if (( rc == 124 || rc == 137 )); then
    echo "=== $name: TIMED OUT after $(( SECONDS - t0 ))s (limit ${limit}s)"
  else
    echo "=== $name: exit $rc after $(( SECONDS - t0 ))s"
  fi
  (( rc != 0 )) && STATUS=1
  return 0
}

echo "=== device"
timeout $(( 60 * LIMIT_SCALE )) "$PY" -c 'import jax; print(jax.__version__, jax.devices(), jax.default_backend())' || STATUS=1
command -v nvidia-smi >/dev/null && nvidia-smi -L
nproc
"$PY" -m jaxroute.cli --help >/dev/null || { echo "python3 -m jaxroute.cli does not run"; exit 1; }

# Benchmarks: every part at accelerator seed counts (--gpu-sizes: dispatch up to 65,536 seeds, cluster and
# decode up to 4,096; a size that runs out of memory is recorded and the smaller ones kept). Parts run in
# three calls so a slow one cannot starve the others; each writes its JSON as it goes.
if (( QUICK )); then
  BENCH=("$PY" -m jaxroute.cli bench --quick)
  stage "bench dispatch" 110 "${BENCH[@]}" --only dispatch --out "$DEST/bench_dispatch.json"
  stage "bench cluster" 170 "${BENCH[@]}" --only cluster --out "$DEST/bench_cluster.json"
  stage "bench blis, trace, decode, decision" 130 "${BENCH[@]}" --only blis,trace,decode,decision \
    --out "$DEST/bench_rest.json"
else
  BENCH=("$PY" -m jaxroute.cli bench --gpu-sizes --max-repeat-s 20)
  stage "bench dispatch" 110 "${BENCH[@]}" --only dispatch --dispatch-requests 10000 --out "$DEST/bench_dispatch.json"
  stage "bench cluster" 170 "${BENCH[@]}" --only cluster --workloads toolbench --cluster-requests 200 \
    --out "$DEST/bench_cluster.json"
  stage "bench blis, trace, decode, decision" 130 "${BENCH[@]}" --only blis,trace,decode,decision \
    --blis-requests 2000 --trace-sizes 2000,10000 --decode-requests 500 --decode-seeds 1,64,1024 --calls 500 \
    --out "$DEST/bench_rest.json"
fi

timeout $(( 30 * LIMIT_SCALE )) "$PY" - "$DEST" <<'PY' || STATUS=1
import json, pathlib, sys
dest = pathlib.Path(sys.argv[1])
merged = None
for name in ("bench_dispatch.json", "bench_cluster.json", "bench_rest.json"):
    p = dest / name
    if not p.exists():
        print(f"{name}: missing (stage skipped or killed before its first result)")
        continue
    part = json.loads(p.read_text())
    if merged is None:
        merged = dict(part, models=[], errors=[], parts_from=[])
    merged["models"] += part.get("models", [])
    merged["errors"] += part.get("errors", [])
    merged["parts_from"].append({"file": name, "partial": part.get("partial"), "config": part.get("config")})
    for key in ("blis", "trace", "decision"):
        if part.get(key) is not None:
            merged[key] = part[key]
if merged is not None:
    (dest / "bench.json").write_text(json.dumps(merged, indent=1))
    print(f"largest seed count that fit, per model ({merged['n_devices']} x {merged['device']['kind']}):")
    for m in merged["models"]:
        best = max(m["sizes"], key=lambda s: s["requests_per_s"], default=None)
        failed = m.get("failed")
        print(f"  {m['model']:<32} {m['largest_seeds_that_fit']!s:>6} seeds; best {best['requests_per_s'] if best else 0:,.0f} "
              f"requests/s at {best['seeds'] if best else '-'} seeds" + (f"; {failed['seeds']} seeds: {failed['error']}" if failed else ""))
    print(f"wrote {dest / 'bench.json'}")
PY

# The learned BR-H predictor: the same small-but-real training on the default device (the GPU) and forced
# to the CPU; each stage line gives its wall time.
TRAIN=("$PY" -m jaxroute.cli train-predictor --workload synthetic-azure24 --requests 20000 --steps 1000 --batch 1024
       --patience 100 --no-progress)
(( QUICK )) && TRAIN=("$PY" -m jaxroute.cli train-predictor --workload synthetic-azure24 --requests 500 --steps 20
                      --batch 64 --patience 10 --no-progress)
stage "train-predictor, default device" 60 "${TRAIN[@]}" --save "$DEST/ckpt_gpu"
stage "train-predictor, JAX_PLATFORMS=cpu" 60 env JAX_PLATFORMS=cpu "${TRAIN[@]}" --save "$DEST/ckpt_cpu"

# The test suite's fast subset (the tests simulate 4 CPU devices; a time limit stops it part-way).
if (( QUICK )); then  # the suite itself is what runs --quick: one small file stands for the stage
  stage "pytest tests/test_fast_prng.py" 120 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_fast_prng.py
else
  stage "pytest -m 'not slow' -x" 120 "$PY" -m pytest -q -m 'not slow' -x -p no:cacheprovider
fi

echo "=== done in ${SECONDS}s (budget ${BUDGET_S}s); status $STATUS; log $LOG"
exit $STATUS

#!/bin/bash
# One device call: the GPU gates of the vLLM dispatch (GDN in vLLM's real layer, the block-fp8 linear layer, the fp8
# kernels' gates), the GDN crossover table and the fp8 linear table (r9k against vLLM's Triton kernel and torch's
# block-scaled _scaled_mm). Logs and JSON under OUTDIR. From the repository root on the GPU machine, with
# .vllm_src (vLLM 0.32.0's Python sources) and .whl (the pure-Python packages vLLM imports) carried:
#   bash benchmarks/device_run.sh OUTDIR [gates|gdn32|gdn8|fp8|fp8host ...]     (default: gates gdn32 fp8)
# On a fresh H200 (kernels compiled cold): gates ~3-4 min, gdn32 (16 key : 32 value heads) ~3 min, gdn8 (4 : 8,
# the seeds' TP4 shapes) ~3 min, fp8 ~1.5 min, fp8host ~20 s; a device call may run 10 minutes, so give it at
# most three of them.
set -u
OUT=${1:?usage: device_run.sh OUTDIR [gates|gdn32|gdn8|fp8|fp8host ...]}
shift
STEPS=${*:-gates gdn32 fp8}
mkdir -p "$OUT"
source benchmarks/_device_env.sh || exit 2
FAILED=0
run() {  # run NAME LIMIT_S CMD...: log to OUT/NAME.log, print the exit status and the log's tail
  local name=$1 limit=$2 rc; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc ($(date +%T))"; grep -v "^INFO\|^DEBUG\|^WARNING" "$OUT/$name.log" | tail -n 6
  [ "$rc" -eq 0 ] || FAILED=1
}
for step in $STEPS; do
  case $step in
    gates) run gates 280 python3 -m pytest -q -n 4 -rfs --tb=short -m gpu -p no:cacheprovider \
             tests/kernels/test_gdn_vllm.py tests/kernels/test_fp8_dispatch.py tests/kernels/test_fp8_wgmma.py ;;
    gdn32) run gdn_crossover_hv32 240 python3 -m benchmarks.gdn_crossover --heads 16:32 \
             --json "$OUT/gdn_crossover_hv32.json" ;;
    gdn8) run gdn_crossover_hv8 240 python3 -m benchmarks.gdn_crossover --heads 4:8 \
             --json "$OUT/gdn_crossover_hv8.json" ;;
    fp8) run fp8_linear 180 python3 -m benchmarks.fp8_linear --json "$OUT/fp8_linear.json" ;;
    fp8host) run fp8_host 100 python3 -m benchmarks.fp8_host ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
exit $FAILED

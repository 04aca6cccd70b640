#!/bin/bash
# Every kernel gate and bench in three device calls (a call may run 10 minutes): the gates (~4-5 min on one
# H200; on 2+ GPUs also the all-reduce's), then the benches (~8-9 min: gdn by kernel time, the expert cache
# eager and in a CUDA graph, fp8 decode by kernel time, the fp8 sweep; on 2+ GPUs the all-reduce's too, +1.5
# min: give that machine its own call). The sweeps (gdn_bench --sweep-kc / --sweep-chunk / --short-sweep,
# fp8_bench --decode-tiles) take calls of their own. Usage, from the repository root on the GPU machine:
#   bash kernels/bench/device_run.sh OUTDIR gates
#   bash kernels/bench/device_run.sh OUTDIR benches
#   bash kernels/bench/device_run.sh OUTDIR gluon     (Hopper: the Gluon fp8 kernels against _scaled_mm)
# fla-core (the gdn bench's baseline) must be importable: carry its wheel (README of the device tool).
# Gates first, in parallel pytest workers (compile-bound); then the benches, one at a time on a quiet GPU.
# Each step has its own time limit so one slow step cannot eat the others' time; logs go to OUTDIR.
set -u
OUT=${1:?usage: device_run.sh OUTDIR gates|benches|gluon}
PHASE=${2:?usage: device_run.sh OUTDIR gates|benches|gluon}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
FAILED=0
run() {  # run NAME LIMIT_S CMD...: log to OUT/NAME.log, print the exit status and the log's tail
  local name=$1 limit=$2 rc; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc ($(date +%T))"; tail -n 4 "$OUT/$name.log"
  [ "$rc" -eq 0 ] || FAILED=1
}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$PHASE" = gates ]; then
  run gates 300 python3 -m pytest -q -n 8 -rf --tb=short -m gpu -p no:cacheprovider tests/kernels \
      --ignore=tests/kernels/test_allreduce.py
  if [ "$NGPU" -ge 2 ]; then run allreduce_gates 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/kernels/test_allreduce.py; fi
elif [ "$PHASE" = benches ]; then
  run gdn_bench 150 python3 -m kernels.bench.gdn_bench --kernel-time --json "$OUT/gdn.json"
  run moe_bench 150 python3 -m kernels.bench.moe_bench --json "$OUT/moe.json"
  run fp8_decode 60 python3 -m kernels.bench.fp8_bench --decode-tiles --kernel-time --json "$OUT/fp8_decode.json"
  run fp8_bench 230 python3 -m kernels.bench.fp8_bench --json "$OUT/fp8.json"
  if [ "$NGPU" -ge 2 ]; then
    run allreduce_bench 100 python3 -m kernels.bench.allreduce_multigpu --json "$OUT/allreduce.json"; fi
elif [ "$PHASE" = gluon ]; then  # the Gluon fp8 kernels (Hopper) against _scaled_mm, ~2 min
  run fp8_gluon_prefill 120 python3 -m kernels.bench.fp8_wgmma_bench --prefill-repeat 9 --prefill-kernel-time \
      --json "$OUT/fp8_gluon_prefill.json"
  run fp8_gluon_decode 90 python3 -m kernels.bench.fp8_wgmma_bench --decode-default --json "$OUT/fp8_gluon_decode.json"
else
  echo "phase must be gates, benches or gluon" >&2; exit 2
fi
exit $FAILED  # 1 when any step failed or ran out of time

#!/bin/bash
# One device call: GPU gates and kernel benchmarks, each step a command of the runner (python -m benchmarks.kernels)
# or of pytest, with its own time limit so that one slow step cannot eat the others' time; logs, JUnit XML (pytest
# steps, with a line of counts per test file) and JSON (runner steps) under OUTDIR, then one summary of every step
# (OUTDIR/summary.json and a table: exit status, time, counts; python3 -m benchmarks.device_report). From the
# repository root on the GPU machine, with .device_env carried (the environment archive: vLLM 0.32.0's Python
# sources and the wheels they import, fla-core; built where a package index answers by
# `python -m benchmarks.device_env build`, unpacked here by _device_env.sh):
#   bash benchmarks/device_run.sh OUTDIR [STEP ...]          (default: env gates gdn32 fp8)
# The exit status is 1 when any step failed (a failed test, a benchmark impl without a figure, a step timed out).
# Steps (a fresh H200 compiles every kernel cold; a device call may run 10 minutes, so give it three or four):
#   env        every vLLM module r9k binds to (pins.toml's roots) and fla import from the archive (~10 s)
#   gates      the vLLM dispatch gates and the Gluon fp8 gates (~3-4 min)
#   gates_all  every GPU kernel gate (~7 min cold, 8 workers; with 2+ GPUs also the all-reduce's)
#   gdn32      the GDN prefill crossover at 16 : 32 heads, r9k's dispatch against vLLM's chunked core (~3 min)
#   gdn8       the same at 4 : 8 heads (the seeds' TP 4 rank, ~3 min)
#   gdn        gdn_seq against fla's recurrent and chunked cores, gdn_conv against vLLM's (needs fla-core, ~2 min)
#   fp8        the fp8 GEMM and linear against vLLM's Triton kernel and torch's block-scaled _scaled_mm (~1.5 min)
#   fp8host    the host's and the GPU's time a call of fp8_linear and fp8_gemm at M 1-256 and 4096 against
#              torch's and vLLM's, Gluon on and off; the pieces' host time; the prefill tile at M 128-256  (~1.5 min cold)
#   fp8decode  decode GEMMs by kernel time against per-tensor _scaled_mm, both flushes (~1.5 min)
#   fp8prefill prefill GEMMs against per-tensor _scaled_mm, nine rounds (~1.5 min)
#   moe        the expert cache's insert rate and the fused top-k sum (~2 min)
#   moe_layer  the expert cache inside vLLM's Triton MoE layer: bit-identical to stock in bf16 and block fp8,
#              reading misses through the pointer table and staging them, a read-through step in a CUDA graph,
#              the device memory (E=512, top-10, the seeds' routing); the pointer-table GEMM against vLLM's kernel;
#              then the decode step under CUDA-graph replay at 1, 8, 32 requests and 270 / 135 of 512 slots against
#              all-resident, UVA offload and the staging cache, with decode traffic, and with the fresh draw
#              against all-resident and UVA (each step capped: 200 + 220 + 110 s)
#   split      the GDN dispatch's per-sequence split against vLLM's real fla core: a sequence batched equals
#              itself alone (tests/kernels/gdn/test_vllm_split.py -m gpu, ~1 min)
#   allreduce  the one-shot all-reduce against NCCL (2+ GPUs, ~1.5 min)
# Serving (docs/serving.md): r9k-validate launches vLLM on the GPU through its own launcher and runs the checklist's
# suites on the quick profile; the records, server logs, RELEASE.md and figures go to OUT/reports.tgz (the device
# tool brings back files two folders down at most); a release step that fails prints its server logs' last errors.
# R9K_SERVE_CONFIG (default h200-next) and R9K_SERVE_SUITES (a space-separated subset of the checklist; default all)
# choose what runs; R9K_REPORTS an existing reports folder
# (carried from an earlier call) to add to; R9K_SERVE_LIMIT a release step's limit in seconds (default 560).
#   serve_ops    the stand-ins' GPU tests (tests/benchmarks/test_serve_ops.py -m gpu: the device views, ~20 s)
#   serve_smoke  start the configuration's server and stop at its first served request (benchmarks/serve_smoke.py)
#   serve_stock  the release `stock` with every knob at its stock value (--knobs stock; the baseline of the pair)
#   serve_r9k    the release `r9k` with the configuration's knobs, gated against `stock` where its records exist
#   serve_gate   `gate r9k --against stock` and `gate --perf`, JUnit beside each
#   release:NAME:KNOBS[:CONFIG[:SUITES]]  one release of the quick checklist under a knob set (e.g.
#                release:stock-again:stock, release:gdn:gdn::sanity+probe+betterbench), gated against `stock`;
#                release:offload:stock:h200-next-offload is the memory pair's other side (vLLM's UVA offload of the
#                bytes the cache saves)
#   serve_attr   the attribution table of every knob-set release and `r9k` present against `stock`, to
#                OUT/attribution.md, and `moe` against `offload` (the memory pair) to OUT/attribution_offload.md
set -u
OUT=${1:?usage: device_run.sh OUTDIR [STEP ...]}
shift
STEPS=${*:-env gates gdn32 fp8}
mkdir -p "$OUT"
source benchmarks/_device_env.sh || exit 2
FAILED=0
: > "$OUT/steps.jsonl"
step() {  # step KIND NAME LIMIT_S CMD...: log to OUT/NAME.log, record the step, print its exit status and log tail
  local kind=$1 name=$2 limit=$3 rc t0 t1; shift 3
  rm -f "$OUT/$name.xml" "$OUT/$name.json"  # a file left by an earlier run into OUT must not be read as this one's
  t0=$(date +%s.%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  LAST_RC=$rc
  t1=$(date +%s.%N)
  awk -v n="$name" -v k="$kind" -v rc="$rc" -v a="$t0" -v b="$t1" \
    'BEGIN { printf "{\"step\": \"%s\", \"kind\": \"%s\", \"rc\": %d, \"seconds\": %.1f}\n", n, k, rc, b - a }' \
    >> "$OUT/steps.jsonl"
  echo "== $name rc=$rc ($(date +%T))"; grep -v "^INFO\|^DEBUG\|^WARNING" "$OUT/$name.log" | tail -n 6
  [ "$rc" -eq 0 ] || FAILED=1
}
run() {  # run NAME LIMIT_S CMD...: a runner step (its --json is OUT/NAME.json)
  step bench "$@"
}
tests() {  # tests NAME LIMIT_S PYTEST_ARGS...: a pytest step, its JUnit OUT/NAME.xml and a line per test file
  local name=$1 limit=$2; shift 2
  step pytest "$name" "$limit" python3 -m pytest --junitxml="$OUT/$name.xml" -o junit_family=xunit1 "$@"
  [ -f "$OUT/$name.xml" ] && python3 -m benchmarks.device_report counts "$OUT/$name.xml"
}
K="python3 -m benchmarks.kernels"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
REPORTS=${R9K_REPORTS:-$OUT/reports}
SERVE_CONFIG=${R9K_SERVE_CONFIG:-h200-next}
SERVE_SUITES=""
for s in ${R9K_SERVE_SUITES:-}; do SERVE_SUITES="$SERVE_SUITES --suite $s"; done
V="python3 -m validate.cli"
serve_release() {  # serve_release NAME LIMIT_S RELEASE ARGS...: one release of the quick checklist on the GPU
  local name=$1 limit=$2 release=$3; shift 3
  step check "$name" "$limit" $V release "$release" --config "$SERVE_CONFIG" --profile quick --reports "$REPORTS" \
    --junit-xml "$OUT/$name.xml" $SERVE_SUITES "$@"
  tar czf "$OUT/reports.tgz" -C "$(dirname "$REPORTS")" "$(basename "$REPORTS")" 2>/dev/null
  # a server that stopped during start-up names its cause in its own log, not in the step's: its last errors
  [ "$LAST_RC" -eq 0 ] || grep -h "Error\|ERROR" "$REPORTS/$release"/*/server*.log 2>/dev/null | tail -n 20
}
GRID="N=1|2|4|8|16|32|64,L=16|32|64|128|256|512"
LINEAR="M=1|16|32|64|128|256,N=4096,K=4096;M=1|16,N=8192,K=8192;M=4096,N=4096,K=4096;M=8192,N=8192,K=8192"
DECODE="M=1|16|32|64,N=4096,K=4096;M=16,N=8192,K=8192"
for step in $STEPS; do
  case $step in
    env) step check env 120 python3 -m benchmarks.device_env imports ;;
    gates) tests gates 280 -q -n 4 -rfs --tb=short -m gpu -p no:cacheprovider \
             tests/kernels/gdn/test_vllm_layer.py tests/kernels/fp8/test_linear_dispatch.py \
             tests/kernels/fp8/test_wgmma.py ;;
    gates_all) tests gates_all 540 -q -n 8 -rf --tb=short -m gpu -p no:cacheprovider tests/kernels \
                 --ignore=tests/kernels/allreduce
               if [ "$NGPU" -ge 2 ]; then tests gates_allreduce 150 -q -m gpu -p no:cacheprovider \
                 tests/kernels/allreduce; fi ;;
    gdn32) run gdn_prefill_hv32 240 $K --op gdn_prefill --peer vllm_chunk --mode loop --mode graph \
             --shapes "H=16,HV=32,$GRID" --json "$OUT/gdn_prefill_hv32.json" ;;
    gdn8) run gdn_prefill_hv8 240 $K --op gdn_prefill --peer vllm_chunk --mode loop --mode graph \
            --shapes "H=4,HV=8,$GRID" --json "$OUT/gdn_prefill_hv8.json" ;;
    gdn) run gdn_seq 150 $K --op gdn_seq --mode kernel --mode graph --mode eager --json "$OUT/gdn_seq.json"
         run gdn_conv 60 $K --op gdn_conv --mode kernel --mode graph --json "$OUT/gdn_conv.json" ;;
    fp8) run fp8_linear 180 $K --op fp8_gemm --op fp8_linear --peer vllm --peer torch_block --peer torch \
           --peer scaled_mm --peer torch_f_block --peer torch_f \
           --mode loop --mode eager --mode graph --mode host --shapes "$LINEAR" --json "$OUT/fp8_linear.json" ;;
    fp8host) run fp8_host_launch 60 $K --op launch --mode host --json "$OUT/fp8_host_launch.json"
             run fp8_host_table 300 $K --op fp8_linear --op fp8_gemm --peer torch --peer torch_f --peer vllm \
               --peer torch_block --peer torch_f_block --variant triton --mode host --mode graph \
               --shapes "M=1|2|4|8|16|32|64|128|256|4096,N=4096,K=4096" --json "$OUT/fp8_host_table.json"
             run fp8_host_calls 60 $K --op fp8_linear --op fp8_gemm --peer torch --peer torch_block --mode host --profile \
               --shapes "M=16,N=4096,K=4096" --json "$OUT/fp8_host_calls.json"
             run fp8_host_quant 60 $K --op fp8_quant --no-peers --mode host --shapes "M=16,K=4096" \
               --json "$OUT/fp8_host_quant.json"
             run fp8_host_tiles 100 $K --op fp8_gemm --peer torch_block --variant ws2_bn64 --variant ws2_bn32 \
               --mode graph --shapes "M=128|256,N=4096,K=4096;M=128|256,N=8192,K=8192" \
               --json "$OUT/fp8_host_tiles.json" ;;
    fp8decode) run fp8_decode_zero 90 $K --op fp8_gemm --peer scaled_mm --variant tile_decode --variant small_m \
                 --mode kernel --flush zero --shapes "$DECODE" --json "$OUT/fp8_decode_zero.json"
               run fp8_decode_read 90 $K --op fp8_gemm --peer scaled_mm --variant tile_decode --variant small_m \
                 --mode kernel --flush read --shapes "$DECODE" --json "$OUT/fp8_decode_read.json" ;;
    fp8prefill) run fp8_prefill 120 $K --op fp8_gemm --peer scaled_mm --variant tma --mode eager --repeat 9 \
                  --shapes "M=4096,N=4096,K=4096;M=8192,N=8192,K=8192" --json "$OUT/fp8_prefill.json" ;;
    moe) run expert_cache 150 $K --op expert_cache --mode loop --mode graph --json "$OUT/expert_cache.json"
         run moe_topk_sum 60 $K --op moe_topk_sum --mode eager --json "$OUT/moe_topk_sum.json" ;;
    moe_layer) tests moe_layer 200 -q -rfs --tb=short -m gpu -p no:cacheprovider tests/kernels/moe/test_vllm_moe_layer.py \
                 tests/kernels/moe/test_ptr_gemm.py tests/kernels/moe/test_read_through.py
               run moe_decode_step 220 $K --op moe_decode_step --peer resident --peer uva --peer stage --mode graph \
                 --shapes "decode=1,requests=1|8|32,slots=270|135" --json "$OUT/moe_decode_step.json"
               run moe_decode_fresh 110 $K --op moe_decode_step --peer resident --peer uva --mode graph \
                 --shapes "decode=0,requests=1|8|32,slots=270|135" --json "$OUT/moe_decode_fresh.json" ;;
    split) tests split 240 -q -rfs --tb=short -m gpu -p no:cacheprovider tests/kernels/gdn/test_vllm_split.py ;;
    serve_ops) tests serve_ops 120 -q -rfs --tb=short -m gpu -p no:cacheprovider \
                 tests/benchmarks/test_serve_ops.py ;;
    serve_smoke) step check serve_smoke "${R9K_SERVE_LIMIT:-900}" python3 -m benchmarks.serve_smoke --config "$SERVE_CONFIG" \
                   --out "$OUT/smoke" ;;
    serve_stock) serve_release serve_stock "${R9K_SERVE_LIMIT:-560}" stock --knobs stock --baseline none ;;
    serve_r9k) if [ -d "$REPORTS/stock" ]; then serve_release serve_r9k "${R9K_SERVE_LIMIT:-560}" r9k --baseline stock
               else serve_release serve_r9k "${R9K_SERVE_LIMIT:-560}" r9k --baseline none; fi ;;
    release:*) # release:NAME:KNOBS[:CONFIG[:SUITES]]: the release NAME of CONFIG (default R9K_SERVE_CONFIG) under
               # KNOBS (stock, config or a knob set the configuration names), SUITES '+'-separated (default
               # R9K_SERVE_SUITES), gated against the release `stock` where its records exist
               IFS=: read -r _ rel knobs cfg suites <<< "$step"
               cfg=${cfg:-$SERVE_CONFIG}; args=""
               for s in ${suites//+/ }; do args="$args --suite $s"; done
               [ -z "$suites" ] && args=$SERVE_SUITES
               base=none; [ "$rel" != stock ] && [ -d "$REPORTS/stock/$cfg" ] && base=stock
               SERVE_CONFIG=$cfg SERVE_SUITES=$args serve_release "release_${rel}_${cfg}" "${R9K_SERVE_LIMIT:-900}" \
                 "$rel" --knobs "$knobs" --baseline "$base" ;;
    serve_gate) step check serve_gate 60 $V gate r9k --against stock --reports "$REPORTS" --junit-xml "$OUT/gate.xml"
                step check serve_gate_perf 60 $V gate r9k --against stock --perf --reports "$REPORTS" \
                  --junit-xml "$OUT/gate_perf.xml" ;;
    serve_attr) rels=$(for r in gdn moe fp8 r9k; do [ -d "$REPORTS/$r/$SERVE_CONFIG" ] && echo "$r"; done)
                step check serve_attr 60 $V attribution --config "$SERVE_CONFIG" --baseline stock --releases $rels \
                  --reports "$REPORTS" --markdown "$OUT/attribution.md"
                if [ -d "$REPORTS/offload" ] && [ -d "$REPORTS/moe" ]; then
                  step check serve_attr_offload 60 $V attribution --config "$SERVE_CONFIG" --baseline offload \
                    --against-config h200-next-offload --releases moe --reports "$REPORTS" \
                    --markdown "$OUT/attribution_offload.md"
                fi ;;
    allreduce) if [ "$NGPU" -ge 2 ]; then run allreduce 120 $K --op allreduce --mode loop --mode graph \
                 --json "$OUT/allreduce.json"; else echo "== allreduce skipped: $NGPU GPU(s)"; fi ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== summary"
python3 -m benchmarks.device_report summary "$OUT" || FAILED=1
exit $FAILED

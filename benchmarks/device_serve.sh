#!/bin/bash
# A whole GPU serving session as one detached pipeline, so that a lease is never idle between device calls (a call
# runs 10 minutes at most; a machine goes back 30 s after a call ends; a process in its own session runs on):
#   bash benchmarks/device_serve.sh start WORK STEP ...   copy this checkout (with .device_env) to WORK/tree and start
#                                                         `device_run.sh WORK/out STEP ...` there under setsid; returns
#   bash benchmarks/device_serve.sh watch WORK OUT [MAX_S]  wait until the pipeline ends or MAX_S seconds pass
#                                                         (default 540), print its progress, and copy what it has
#                                                         made so far into OUT (the device tool brings OUT back)
# The steps are device_run.sh's (its header lists them); run them in priority order, since the lease may end first.
# What watch copies (at most 8 files, as the device tool brings back): pipeline.log (every step's line and log tail),
# steps.jsonl (exit status and seconds a step), summary.json, reports.tgz (records, server logs, notes, figures) and
# logs.tgz (each step's own log, JUnit XML and JSON).
set -u
cmd=${1:?usage: device_serve.sh start WORK STEP ... | watch WORK OUT [MAX_S]}
WORK=${2:?a work folder, e.g. /tmp/r9k-serve}
case $cmd in
  start)
    shift 2
    [ -f .device_env/gpu-env.tar.xz ] || { echo "no .device_env/gpu-env.tar.xz: carry .device_env" >&2; exit 2; }
    if [ -f "$WORK/pid" ] && kill -0 "$(cat "$WORK/pid")" 2>/dev/null; then
      echo "a pipeline is already running in $WORK (pid $(cat "$WORK/pid"))" >&2; exit 2
    fi
    rm -rf "$WORK/tree" "$WORK/out" "$WORK/pid" && mkdir -p "$WORK/tree" "$WORK/out" || exit 2
    # the tree the pipeline runs is a copy: a later device call re-sends the working tree under the caller's feet
    tar cf - --exclude=./.git --exclude=./reports --exclude='*/__pycache__' . | tar xf - -C "$WORK/tree" || exit 2
    git rev-parse HEAD > "$WORK/out/commit" 2>/dev/null
    # the pid file holds the pipeline's own shell (setsid may fork, so $! would be a process that has left)
    (cd "$WORK/tree" && setsid bash -c 'echo $$ > "$0/pid"; exec bash benchmarks/device_run.sh "$0/out" "$@" \
       > "$0/pipeline.log" 2>&1 < /dev/null' "$WORK" "$@" &)
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$WORK/pid" ] && break; sleep 0.5; done
    echo "started $(cat "$WORK/pid") in $WORK: $*" ;;
  watch)
    OUT=${3:?an output folder}
    max=${4:-540}
    t0=$(date +%s)
    while kill -0 "$(cat "$WORK/pid" 2>/dev/null || echo 0)" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$max" ]; do
      sleep 5
    done
    if kill -0 "$(cat "$WORK/pid" 2>/dev/null || echo 0)" 2>/dev/null; then state=running; else state=ended; fi
    mkdir -p "$OUT"
    cp "$WORK/pipeline.log" "$OUT/" 2>/dev/null
    for f in steps.jsonl summary.json reports.tgz commit; do cp "$WORK/out/$f" "$OUT/" 2>/dev/null; done
    (cd "$WORK/out" && tar czf "$OUT/logs.tgz" --exclude=reports --exclude=reports.tgz ./*.log ./*.xml ./*.json \
       ./smoke 2>/dev/null)
    nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv,noheader 2>/dev/null
    echo "== pipeline $state after $(( $(date +%s) - t0 )) s of watching"
    grep "^== " "$WORK/pipeline.log" 2>/dev/null | tail -n 30 ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Two threads against one for the fused kernel, n >= 2048 (the target: at least 1.9x). Each
# line times 1 and then 2 threads back to back and prints their minimum wall times and CPU
# times: on a busy host a 2-thread run whose CPU time is not about twice its wall time did not
# get both cores, and its ratio says nothing about the kernel.
#   bench/thread_scaling.sh [path/to/qkv]
set -euo pipefail
QKV=${1:-build/qkv}
printf '%-6s %-4s %-7s %9s %9s %9s %9s %7s\n' n d causal 1T_ms 1T_cpu 2T_ms 2T_cpu ratio
for n in 2048 4096; do
  for d in 64 128; do
    for causal in "" "--causal"; do
      one=$("$QKV" bench --n "$n" --d "$d" --heads 8 --threads 1 $causal --no-baseline \
              --peak-gflops 1 --json | tr -d '\n')
      two=$("$QKV" bench --n "$n" --d "$d" --heads 8 --threads 2 $causal --no-baseline \
              --peak-gflops 1 --json | tr -d '\n')
      python3 - "$one" "$two" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
ca, cb = a["chosen"], b["chosen"]
print("%-6d %-4d %-7s %9.2f %9.2f %9.2f %9.2f %6.2fx" % (a["n"], a["d"], "yes" if a["causal"] else "no",
      ca["min_ms"], ca["cpu_ms"], cb["min_ms"], cb["cpu_ms"], ca["min_ms"] / cb["min_ms"]))
PY
    done
  done
done

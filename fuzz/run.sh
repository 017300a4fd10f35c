#!/usr/bin/env bash
# Runs each libFuzzer target of build/libfuzzer for FUZZ_SECONDS seconds (`make fuzz` builds
# them and calls this; not build/fuzz, the release build's tree for fuzz/'s replay tests). Each
# target starts from its committed seeds (fuzz/corpus/NAME) plus what earlier runs found
# (build/libfuzzer/corpus/NAME, where libFuzzer adds new inputs). A single allocation above
# -malloc_limit_mb (a size taken from a header, say) counts as a failure, like a crash.
# FUZZ_JOBS targets run at once (default: one per core), each on one core: every target still
# gets its FUZZ_SECONDS, and the step takes 1/FUZZ_JOBS of the time.
# On a failure the input is copied to fuzz/regressions/NAME, which ctest replays from then on
# (commit it with the fix). Prints executions per target; exits 1 if any target failed.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-npy safetensors npz cli_args attention_diff kv_cache}
flags=${FUZZ_FLAGS:--malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10}
jobs=${FUZZ_JOBS:-$(nproc)}
build=build/libfuzzer
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

# One target: its run, then its summary line in $results/NAME.line and, on a failure, the
# log's tail in $results/NAME.failed (printed after every target has ended, so that two
# targets' reports do not interleave).
fuzz_one() {
  local name=$1
  local binary=$build/fuzz/fuzz_$name
  local work=$PWD/$build/corpus/$name
  local artifacts=$PWD/$build/artifacts/$name
  local log=$build/fuzz_$name.log
  mkdir -p "$work" "$artifacts"
  # shellcheck disable=SC2086
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
    "$binary" -max_total_time="$seconds" -print_final_stats=1 $flags \
    -artifact_prefix="$artifacts/" "$work" "$PWD/fuzz/corpus/$name" >"$log" 2>&1
  local status=$?
  local execs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  local line="$name: ${execs:-?} executions (${rate:-?}/s), corpus $(ls "$work" | wc -l) inputs"
  if [ $status -ne 0 ]; then
    line="$line, FAILED (exit $status)"
    tail -n 40 "$log" >"$results/$name.failed"
    for artifact in "$artifacts"/*; do
      [ -f "$artifact" ] || continue
      cp "$artifact" "fuzz/regressions/$name/"
      echo "fuzz: kept $(basename "$artifact") in fuzz/regressions/$name/" \
        "(replayed by ctest -L fuzz)" >>"$results/$name.failed"
    done
  fi
  echo "$line" >"$results/$name.line"
}

running=0
for name in $targets; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  echo "fuzz: $name for ${seconds}s ($flags)"
  fuzz_one "$name" &
  running=$((running + 1))
done
wait

failed=0
echo "fuzz summary (${seconds}s per target, $jobs at once):"
for name in $targets; do
  if [ -f "$results/$name.failed" ]; then
    failed=1
    cat "$results/$name.failed" >&2
  fi
  echo "  $(cat "$results/$name.line" 2>/dev/null || echo "$name: no result")"
done
exit $failed

#!/usr/bin/env bash
# Runs each libFuzzer target of build/libfuzzer for FUZZ_SECONDS seconds (`make fuzz` builds
# them and calls this; not build/fuzz, the release build's tree for fuzz/'s replay tests). Each
# target starts from its committed seeds (fuzz/corpus/NAME) plus what earlier runs found
# (build/libfuzzer/corpus/NAME, where libFuzzer adds new inputs). A single allocation above
# -malloc_limit_mb (a size taken from a header, say) counts as a failure, like a crash.
# On a failure the input is copied to fuzz/regressions/NAME, which ctest replays from then on
# (commit it with the fix). Prints executions per target; exits 1 if any target failed.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-npy safetensors npz cli_args attention_diff kv_cache}
flags=${FUZZ_FLAGS:--malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10}
build=build/libfuzzer
failed=0
summary=""

for name in $targets; do
  binary=$build/fuzz/fuzz_$name
  work=$PWD/$build/corpus/$name
  artifacts=$PWD/$build/artifacts/$name
  log=$build/fuzz_$name.log
  mkdir -p "$work" "$artifacts"
  echo "fuzz: $name for ${seconds}s ($flags)"
  # shellcheck disable=SC2086
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
    "$binary" -max_total_time="$seconds" -print_final_stats=1 $flags \
    -artifact_prefix="$artifacts/" "$work" "$PWD/fuzz/corpus/$name" >"$log" 2>&1
  status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  line="$name: ${execs:-?} executions (${rate:-?}/s), corpus $(ls "$work" | wc -l) inputs"
  if [ $status -ne 0 ]; then
    failed=1
    line="$line, FAILED (exit $status)"
    tail -n 40 "$log" >&2
    for artifact in "$artifacts"/*; do
      [ -f "$artifact" ] || continue
      cp "$artifact" "fuzz/regressions/$name/"
      echo "fuzz: kept $(basename "$artifact") in fuzz/regressions/$name/ (replayed by ctest -L fuzz)" >&2
    done
  fi
  echo "fuzz: $line"
  summary="$summary  $line"$'\n'
done

echo "fuzz summary (${seconds}s per target):"
printf '%s' "$summary"
exit $failed

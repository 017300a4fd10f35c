# Sourced by the benchmark scripts: sets RUN, the command prefix that runs "$QKV" with OpenBLAS
# on its proper kernels. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE make it pick slow ones, so they
# are unset for these runs (and only here; tests and CI leave them alone). OpenBLAS 0.3.21 falls
# back to its SSE3 "Prescott" kernels on CPUs newer than it knows (a Xeon of family 6, model 207
# here), a baseline 3-5x slower than OpenBLAS can be: then its AVX-512 kernels (or AVX2 ones)
# are named explicitly, and the script says so.
RUN=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$QKV")
echo "note: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for these runs" >&2
core=$("${RUN[@]}" bench --peak --threads 1 --json | sed -E 's/.*"openblas_core": "([^"]*)".*/\1/')
if [ "$core" = "Prescott" ]; then
  if grep -qw avx512f /proc/cpuinfo; then pick=SkylakeX; else pick=Haswell; fi
  RUN=(env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=$pick "$QKV")
  echo "note: OpenBLAS picked its Prescott fallback on this CPU; the runs set OPENBLAS_CORETYPE=$pick" >&2
fi

"""qkv's threads on torch's OpenMP pool (qkv.use_openmp_threads): importing qkv.torch (or
qkv.transformers) hands qkv's teams to the runtime torch runs its operators on, when torch's
parallel backend is OpenMP (PyPI's builds); the results are the same bits as on qkv's own
threads, for any thread count, forward and backward; a bad library is one qkv.Error line."""

import os
import subprocess
import sys

import pytest

import qkv

torch = pytest.importorskip("torch")
import qkv.torch  # noqa: E402  (the import under test)

TORCH_USES_OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


def run_python(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not TORCH_USES_OPENMP, reason="this torch's parallel backend is not OpenMP")
@pytest.mark.parametrize("module", ["qkv.torch", "qkv.transformers"])
def test_importing_the_torch_integration_puts_qkv_on_torchs_openmp_runtime(module):
    before, after = run_python(
        "import qkv; print(qkv.openmp_threads_library()); "
        f"import {module}; print(qkv.openmp_threads_library())").splitlines()
    assert before == "None"
    torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    # torch's own copy of the runtime (the wheel bundles libgomp), as mapped in the process.
    assert os.path.realpath(after).startswith(torch_lib + os.sep), after
    assert "omp" in os.path.basename(after), after


@pytest.mark.skipif(not TORCH_USES_OPENMP, reason="this torch's parallel backend is not OpenMP")
def test_a_runtime_chosen_before_the_import_is_kept():
    # torch's runtime by its file name (the loader finds the copy torch loaded): qkv.torch's
    # import leaves that choice alone rather than replacing it with the path it would find.
    assert run_python("import torch, qkv; qkv.use_openmp_threads('libgomp.so.1'); "
                      "import qkv.torch; print(qkv.openmp_threads_library())") == "libgomp.so.1"


def grads_on(library, threads):
    qkv.use_openmp_threads(library)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 77, 32, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 90, 32, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 90, 24, generator=g, requires_grad=True)
    d_out = torch.randn(2, 4, 77, 24, generator=g)
    out = qkv.torch.attention(q, k, v, is_causal=True, threads=threads)
    out.backward(d_out)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.skipif(not TORCH_USES_OPENMP, reason="this torch's parallel backend is not OpenMP")
def test_torchs_pool_gives_the_same_bits_as_qkvs_own_threads():
    torch_runtime = qkv.openmp_threads_library()
    assert torch_runtime is not None
    try:
        own = grads_on(None, 1)
        for threads in (1, 2, 3, 8):
            on_torch = grads_on(torch_runtime, threads)
            for a, b in zip(own, on_torch):
                assert torch.equal(a, b), threads
    finally:
        qkv.use_openmp_threads(torch_runtime)


def test_a_library_that_is_not_loaded_or_not_openmp_is_one_line_and_changes_nothing():
    chosen = qkv.openmp_threads_library()
    with pytest.raises(qkv.Error) as raised:
        qkv.use_openmp_threads("/nonexistent/libgomp.so.1")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("OpenMP library /nonexistent/libgomp.so.1: is not loaded"), message
    with pytest.raises(qkv.Error, match=r"^OpenMP library libc\.so\.6: has no GOMP_parallel$"):
        qkv.use_openmp_threads("libc.so.6")
    with pytest.raises(qkv.Error, match=r"^library: expected a path or None, got int$"):
        qkv.use_openmp_threads(3)
    assert qkv.openmp_threads_library() == chosen

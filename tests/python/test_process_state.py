"""A library leaves the process as it found it: qkv's calls from Python change no process-wide
setting. OpenBLAS's thread count (qkv runs its BLAS calls at one OpenBLAS thread on its own
threads, then gives the count back, so NumPy on the same OpenBLAS keeps its threads), the
environment, signal dispositions and masks, the floating-point environment, the locale, the
umask and the working directory are each read before and after every kind of call."""

import ctypes
import ctypes.util
import locale
import os
import re
import signal

import numpy as np
import pytest

import qkv

LIBC = ctypes.CDLL(None)


def loaded_openblases():
    """{path: (get, set)} for every OpenBLAS in the process: the one qkv links (Debian's
    libopenblas) and NumPy's, whichever it is (a wheel's scipy_openblas64 has its names
    suffixed)."""
    found = {}
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line and "/" in line}
    for path in sorted(paths):
        if not re.search(r"\.so(\.|$)", path):
            continue
        lib = ctypes.CDLL(path)
        for get_name, set_name in (("openblas_get_num_threads", "openblas_set_num_threads"),
                                   ("scipy_openblas_get_num_threads64_",
                                    "scipy_openblas_set_num_threads64_")):
            if hasattr(lib, get_name) and hasattr(lib, set_name):
                getter, setter = getattr(lib, get_name), getattr(lib, set_name)
                getter.restype = ctypes.c_int
                setter.argtypes = [ctypes.c_int]
                found[path] = (getter, setter)
                break
    return found


def qkv_openblas():
    """The OpenBLAS the qkv module itself calls, or None when qkv's CBLAS is another."""
    for path, fns in loaded_openblases().items():
        if "libopenblas" in os.path.basename(path):
            return path, fns
    return None


def c_environment():
    """The C library's environment (what getenv reads), not os.environ's copy of it."""
    envp = ctypes.POINTER(ctypes.c_char_p).in_dll(LIBC, "environ")
    out, i = [], 0
    while envp[i] is not None:
        out.append(envp[i])
        i += 1
    return sorted(out)


def signal_state():
    """Caught, ignored and blocked signal masks (the kernel's view) and Python's handlers."""
    with open("/proc/self/status") as status:
        masks = {k: v.strip() for k, v in (line.split(":", 1) for line in status)
                 if k in ("SigBlk", "SigIgn", "SigCgt")}
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[int(sig)] = signal.getsignal(sig)
        except (ValueError, OSError):
            pass
    return masks, handlers


def fp_environment():
    """Rounding mode, enabled traps and the x87/SSE control bits (flush-to-zero,
    denormals-are-zero, precision): the floating-point settings, not its sticky flags."""
    LIBC.fegetround.restype = ctypes.c_int
    LIBC.fegetexcept.restype = ctypes.c_int
    env = (ctypes.c_ubyte * 64)()
    assert LIBC.fegetenv(env) == 0
    raw = bytes(env)
    x87_control = int.from_bytes(raw[0:2], "little")
    mxcsr = int.from_bytes(raw[24:28], "little") & ~0x3F  # without the exception flags
    return LIBC.fegetround(), LIBC.fegetexcept(), x87_control, mxcsr


def process_state():
    umask = os.umask(0o022)
    os.umask(umask)
    return {
        "openblas": {path: get() for path, (get, _) in loaded_openblases().items()},
        "environment": c_environment(),
        "os.environ": dict(os.environ),
        "signals": signal_state(),
        "fp": fp_environment(),
        "locale": locale.setlocale(locale.LC_ALL, None),
        "umask": umask,
        "cwd": os.getcwd(),
    }


def every_kind_of_call(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 64, 16)).astype(np.float32)
    for kernel in (None, "unfused_blas", "fused_hwy"):
        r = qkv.attention(q, q, q, is_causal=True, threads=2, kernel=kernel, return_lse=True)
    qkv.attention_backward(q, q, q, r.out, r.lse, np.ones_like(q), is_causal=True, threads=2)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    qkv.linear(x, rng.standard_normal((16, 16)).astype(np.float32), threads=2)
    w = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3)]
    qkv.MultiHeadAttention(*w, heads=2)(x, threads=2)
    qkv.write_npy(str(tmp_path / "o.npy"), x)
    qkv.read_npy(str(tmp_path / "o.npy"))
    e = qkv.explain(q[0], q[0], q[0])
    e.text(rows=[0])
    e.save_html(str(tmp_path / "e.html"))


@pytest.fixture
def blas_threads_set():
    """Every OpenBLAS in the process set to 3 threads (a count qkv never picks), then back."""
    blases = loaded_openblases()
    before = {path: get() for path, (get, _) in blases.items()}
    for _, set_ in blases.values():
        set_(3)
    yield
    for path, (_, set_) in blases.items():
        set_(before[path])


def test_openblas_thread_count_is_given_back(blas_threads_set):
    found = qkv_openblas()
    if found is None:
        pytest.skip("qkv's CBLAS is not OpenBLAS: it has no thread count to change")
    path, (get, _) = found
    assert get() == 3
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 128, 32)).astype(np.float32)
    qkv.attention(q, q, q, kernel="unfused_blas", threads=2)
    assert get() == 3, f"{path}: qkv.attention left OpenBLAS at {get()} threads, not 3"
    qkv.linear(q[0], rng.standard_normal((32, 32)).astype(np.float32))
    assert get() == 3, f"{path}: qkv.linear left OpenBLAS at {get()} threads, not 3"
    # NumPy's products afterwards, on whichever OpenBLAS NumPy has, run at its count.
    a = rng.standard_normal((256, 256))
    np.testing.assert_allclose(a @ a.T, (a @ a.T).T, rtol=1e-12, atol=1e-12)
    assert get() == 3


def test_every_call_leaves_the_process_as_it_found_it(tmp_path, blas_threads_set):
    before = process_state()
    every_kind_of_call(tmp_path)
    after = process_state()
    for key in before:
        assert after[key] == before[key], f"qkv changed the process's {key}"

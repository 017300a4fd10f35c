"""qkv.bench: timing attention in C++, without Python in the loop."""

import numbers
import statistics
from time import perf_counter
from dataclasses import dataclass, field

import numpy as np

from . import _qkv
from ._arrays import dtype_name
from ._options import attention_options

__all__ = ["bench", "BenchResult", "attention_flops"]


@dataclass(frozen=True)
class BenchResult:
    """What qkv.bench measured.

    seconds: the median seconds of one qkv.attention call (timed in C++); gflops: the useful
    floating-point operations of one call (attention_flops) over `seconds`, in 1e9 per second;
    kernel: the kernel that ran; threads: the threads asked for (0: one per hardware thread);
    numpy_seconds: the median seconds of the same attention written in NumPy (see qkv.bench);
    speedup_vs_numpy: numpy_seconds / seconds; flops: the useful operations of one call;
    times: every timed call's seconds, in order.
    """

    seconds: float
    gflops: float
    kernel: str
    threads: int
    numpy_seconds: float
    speedup_vs_numpy: float
    flops: float
    times: list = field(repr=False)


def _allowed_pairs(nq, nk, is_causal):
    """How many (i, j) pairs the softmax sees: all Nq·Nk, or with is_causal (bottom-right
    aligned) those with j <= i + Nk - Nq, counted exactly in integers."""
    if not is_causal:
        return nq * nk
    rows = np.arange(nq, dtype=np.int64)
    return int(np.clip(rows + (nk - nq) + 1, 0, nk).sum())


def attention_flops(n, d, heads, nk=None, dv=None, is_causal=False, batch=1):
    """Useful floating-point operations of one attention call: 2·(D + Dv) per allowed (i, j)
    pair and query head (q·k and p·v, a multiply and an add each; 4·D when Dv = D), the
    softmax not counted. Causal is bottom-right aligned: key j is allowed for query i iff
    j <= i + Nk - Nq."""
    nk = n if nk is None else nk
    dv = d if dv is None else dv
    return float(batch * heads * _allowed_pairs(n, nk, is_causal) * 2 * (d + dv))


def _numpy_attention(q, k, v, is_causal, scale):
    """softmax(scale·q·kᵀ) · v in NumPy, one head at a time (the memory of one Nq x Nk score
    matrix), in q's dtype: the code a NumPy user would write."""
    h, nq, _ = q.shape
    hkv, nk, dv = v.shape
    group = h // hkv
    out = np.empty((h, nq, dv), dtype=q.dtype)
    forbidden = None
    if is_causal:
        i = np.arange(nq)[:, None]
        j = np.arange(nk)[None, :]
        forbidden = j > i + (nk - nq)
    for head in range(h):
        s = (q[head] @ k[head // group].T) * q.dtype.type(scale)
        if forbidden is not None:
            s[forbidden] = -np.inf
        m = s.max(axis=1, keepdims=True)
        m[~np.isfinite(m)] = 0
        p = np.exp(s - m)
        total = p.sum(axis=1, keepdims=True)
        total[total == 0] = 1
        out[head] = (p @ v[head // group]) / total
    return out


def bench(n=1024, d=64, heads=8, kv_heads=None, nk=None, dv=None, is_causal=False,
          dtype="float32", threads=None, repeats=10, seed=0):
    """Time qkv.attention on random inputs and compare it with the same attention in NumPy.

    Q is [heads, n, d], K [kv_heads, nk, d] and V [kv_heads, nk, dv] (kv_heads defaults to
    heads, nk to n, dv to d), standard normal from numpy.random.default_rng(seed), stored as
    float64 for dtype="float64", float16 for "float16" and float32 otherwise ("bfloat16"
    rounds the float32 values as the kernels read them). One warm-up call, then `repeats`
    calls timed one by one with a steady clock inside a C++ loop that holds no GIL
    (_qkv.time_attention), so Python's own cost is not in the figure; qkv.attention from
    Python adds a few microseconds per call (bench/python_overhead.py measures it).

    The comparison, run in the same process on the same arrays: softmax(scale·q·kᵀ)·v written
    in NumPy (matrix products through NumPy's BLAS, one head at a time, causal by setting
    forbidden scores to -inf), in float64 for dtype="float64" and float32 otherwise, timed
    over min(repeats, 3) calls after one warm-up.

    Returns a BenchResult: the median seconds, GFLOP/s (attention_flops: 2·(d + dv) per
    allowed query-key pair and head, causal pairs counted exactly, bottom-right aligned), the
    kernel that ran and speedup_vs_numpy (the NumPy median over qkv's).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    nk = n if nk is None else nk
    dv = d if dv is None else dv
    name = dtype_name(dtype) or "float32"
    for name_, value, least in (("n", n, 1), ("d", d, 1), ("heads", heads, 1),
                                ("kv_heads", kv_heads, 1), ("nk", nk, 1), ("dv", dv, 1),
                                ("repeats", repeats, 1), ("seed", seed, 0)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            raise _qkv.Error(f"{name_}: must be a whole number, {least} or more, got {value!r}")
    if heads % kv_heads != 0:
        raise _qkv.Error(f"kv_heads: {kv_heads} does not divide heads ({heads})")
    # The inputs are made here, before qkv sees them: bounded so that a typo cannot ask NumPy
    # for terabytes (2^28 elements, 1 GiB of float32, per array).
    for name_, elements in (("n", heads * n * d), ("nk", kv_heads * nk * max(d, dv))):
        if elements > 1 << 28:
            raise _qkv.Error(f"{name_}: the inputs would hold {elements} elements each, more "
                             f"than the 2^28 qkv.bench makes")
    repeats = int(repeats)
    storage = {"float64": np.float64, "float16": np.float16}.get(name, np.float32)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, n, d)).astype(storage)
    k = rng.standard_normal((kv_heads, nk, d)).astype(storage)
    v = rng.standard_normal((kv_heads, nk, dv)).astype(storage)

    options = attention_options(is_causal=is_causal, dtype=name, threads=threads)
    times, kernel = _qkv.time_attention(q, k, v, options, repeats=repeats, warmup=1)
    seconds = statistics.median(times)
    flops = attention_flops(n, d, heads, nk=nk, dv=dv, is_causal=is_causal)

    numpy_dtype = np.float64 if name == "float64" else np.float32
    nq_, nk_, nv_ = (a.astype(numpy_dtype) for a in (q, k, v))
    scale = 1.0 / np.sqrt(d) if d > 0 else 1.0
    numpy_times = []
    for i in range(1 + min(repeats, 3)):
        start = perf_counter()
        _numpy_attention(nq_, nk_, nv_, is_causal, scale)
        if i > 0:
            numpy_times.append(perf_counter() - start)
    numpy_seconds = statistics.median(numpy_times)
    return BenchResult(
        seconds=seconds,
        gflops=flops / seconds * 1e-9 if seconds > 0 else float("inf"),
        kernel=kernel,
        threads=0 if threads is None else int(threads),
        numpy_seconds=numpy_seconds,
        speedup_vs_numpy=numpy_seconds / seconds if seconds > 0 else float("inf"),
        flops=flops,
        times=list(times),
    )

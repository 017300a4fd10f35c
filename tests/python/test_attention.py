"""qkv.attention against the float64 NumPy reference (_reference.py), option by option, on
seeded random shapes.

Tolerances (max |computed - reference| over the output, lse and weights):
  float32 compute: <= F32_TOL = 2e-6 · max(1, max |reference|) (measured worst over 450 random
    calls: 9.4e-7 for out, 3.2e-7 for lse, 7.1e-7 for weights)
  float64 compute: <= 1e-12 · max(1, max |reference|) (measured: 1.7e-15)
  float16 storage and output: per element <= 2^-11 · |reference| (the output's rounding to
    nearest) + F32_TOL · max(1, max |reference|) (the float32 computation)
  bfloat16 storage: against the reference on bf16-rounded inputs, <= 2^-9 · max |v| + F32_TOL:
    qkv rounds the weights P to bfloat16 before P·V (relative error 2^-9 each), so the output
    may differ by 2^-9 · sum_j w_ij |v_j| <= 2^-9 · max |v| (measured: up to 0.6 of that).
"""

import zlib

import numpy as np
import pytest

import qkv
from _reference import bf16_round, max_abs_error, reference, reference_packed, scale_of

F32_TOL = 2e-6
F64_TOL = 1e-12


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(result, expected, tol, what=""):
    out, lse, weights = expected
    scale = scale_of(out)
    err = max_abs_error(result.out, out)
    assert err <= tol * scale, f"{what} out error {err:.3g} > {tol * scale:.3g}"
    if result.lse is not None:
        err = max_abs_error(result.lse, lse)
        assert err <= tol * scale_of(lse), f"{what} lse error {err:.3g}"
    if result.weights is not None:
        err = max_abs_error(result.weights, weights)
        assert err <= tol, f"{what} weights error {err:.3g}"


def shapes(rng, count):
    """(q, k, v) shapes: ranks 2, 3, 4, Nq != Nk, D != Dv, GQA, random sizes."""
    out = []
    for c in range(count):
        rank = 2 + c % 3
        hkv = int(rng.integers(1, 3))
        h = hkv * int(rng.integers(1, 3))
        b = int(rng.integers(1, 3))
        nq, nk = int(rng.integers(1, 40)), int(rng.integers(1, 70))
        d, dv = int(rng.integers(1, 80)), int(rng.integers(1, 80))
        lead_q, lead_k = {2: ((), ()), 3: ((h,), (hkv,)), 4: ((b, h), (b, hkv))}[rank]
        out.append((lead_q + (nq, d), lead_k + (nk, d), lead_k + (nk, dv)))
    return out


# Every dimension 0 somewhere: B, H (with Hkv), Nq, Nk, D, Dv.
ZERO_SHAPES = [
    ((0, 2, 5, 8), (0, 1, 7, 8), (0, 1, 7, 4)),
    ((0, 5, 8), (0, 7, 8), (0, 7, 4)),
    ((2, 0, 8), (2, 7, 8), (2, 7, 4)),
    ((2, 5, 8), (2, 0, 8), (2, 0, 4)),
    ((2, 5, 0), (2, 7, 0), (2, 7, 4)),
    ((2, 5, 8), (2, 7, 8), (2, 7, 0)),
    ((5, 8), (0, 8), (0, 3)),
]

OPTION_SETS = [
    {},
    {"causal": True},
    {"scale": 0.37},
    {"window": (3, 1)},
    {"window": (None, 0)},
    {"window": (2, None), "causal": True},
    {"softcap": 1.5, "scale": 1.0},
    {"alibi": "standard"},
    {"alibi": "given", "causal": True},
    {"sinks": True},
    {"sinks": True, "causal": True, "window": (0, 0)},
    {"mask": "bool"},
    {"mask": "float"},
    {"mask": "bool_broadcast", "causal": True},
    {"mask": "float_broadcast", "softcap": 3.0, "alibi": "given", "sinks": True},
]


def make_call(rng, qs, ks, vs, opts, dtype=np.float32):
    """(arrays and qkv.attention keywords, reference keywords) for one option set."""
    q, k, v = rand(rng, qs, dtype), rand(rng, ks, dtype), rand(rng, vs, dtype)
    h = qs[-3] if len(qs) >= 3 else 1
    nq, nk = qs[-2], ks[-2]
    kw, ref = {}, {}
    if opts.get("causal"):
        kw["is_causal"] = ref["causal"] = True
    if "scale" in opts:
        kw["scale"] = ref["scale"] = opts["scale"]
    if "window" in opts:
        kw["window"] = ref["window"] = opts["window"]
    if "softcap" in opts:
        kw["softcap"] = ref["softcap"] = opts["softcap"]
    if opts.get("alibi") == "standard":
        kw["alibi_slopes"] = True
        ref["alibi"] = qkv.alibi_slopes(h)
    elif opts.get("alibi") == "given":
        slopes = rng.uniform(0.01, 0.5, h).astype(np.float32)
        kw["alibi_slopes"] = slopes
        ref["alibi"] = slopes
    if opts.get("sinks"):
        sinks = rng.standard_normal(h).astype(np.float32)
        kw["sinks"] = ref["sinks"] = sinks
    kind = opts.get("mask")
    if kind:
        full = qs[:-1] + (nk,)
        shape = full if "broadcast" not in kind else (1,) * (len(qs) - 2) + (1, nk)
        if "broadcast" in kind and len(qs) >= 3:
            shape = (qs[-3], 1, nk)  # per head, shared by rows
        if kind.startswith("bool"):
            m = rng.random(shape) < 0.7
        else:
            m = rng.standard_normal(shape).astype(np.float32)
            m[rng.random(shape) < 0.2] = -np.inf
        kw["attn_mask"] = ref["mask"] = m
    return (q, k, v), kw, ref


@pytest.mark.parametrize("opts", OPTION_SETS, ids=lambda o: ",".join(sorted(o)) or "plain")
def test_float32_every_option(opts):
    rng = np.random.default_rng(zlib.crc32(repr(sorted(opts.items())).encode()))
    for qs, ks, vs in shapes(rng, 9) + ZERO_SHAPES:
        (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts)
        result = qkv.attention(q, k, v, return_lse=True, return_weights=True, **kw)
        assert result.out.dtype == np.float32 and result.out.shape == qs[:-1] + (vs[-1],)
        assert result.lse.shape == qs[:-1] and result.weights.shape == qs[:-1] + (ks[-2],)
        assert not np.isnan(result.out).any() and not np.isnan(result.lse).any()
        check(result, reference(q, k, v, **ref), F32_TOL, f"{qs} {ks} {vs} {opts}")


@pytest.mark.parametrize("opts", OPTION_SETS[::2], ids=lambda o: ",".join(sorted(o)) or "plain")
def test_float64(opts):
    rng = np.random.default_rng(7)
    for qs, ks, vs in shapes(rng, 6) + ZERO_SHAPES[:3]:
        (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts, np.float64)
        result = qkv.attention(q, k, v, return_lse=True, return_weights=True, **kw)
        assert result.out.dtype == np.float64
        check(result, reference(q, k, v, **ref), F64_TOL, f"{qs} {opts}")


@pytest.mark.parametrize("opts", OPTION_SETS[::3], ids=lambda o: ",".join(sorted(o)) or "plain")
def test_float16_in_and_out(opts):
    rng = np.random.default_rng(16)
    for qs, ks, vs in shapes(rng, 6):
        (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts, np.float16)
        out = qkv.attention(q, k, v, **kw)
        assert out.dtype == np.float16
        expected = reference(q, k, v, **ref)[0]
        bound = 2.0**-11 * np.abs(expected) + F32_TOL * scale_of(expected)
        excess = np.abs(out.astype(np.float64) - expected) - bound
        assert excess.size == 0 or excess.max() <= 0, f"{qs} {opts}: {excess.max():.3g} over"


@pytest.mark.parametrize("opts", OPTION_SETS[::3], ids=lambda o: ",".join(sorted(o)) or "plain")
def test_bfloat16_storage(opts):
    rng = np.random.default_rng(5)
    for qs, ks, vs in shapes(rng, 6):
        (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts)
        out = qkv.attention(q, k, v, dtype="bfloat16", **kw)
        assert out.dtype == np.float32
        expected = reference(bf16_round(q), bf16_round(k), bf16_round(v), **ref)[0]
        tol = 2.0**-9 * max(1.0, float(np.abs(v).max())) + F32_TOL * scale_of(expected)
        err = max_abs_error(out, expected)
        assert err <= tol, f"{qs} {opts}: {err:.3g} > {tol:.3g}"
        # Not the unrounded inputs' answer: the bf16 rounding must show (it would not if
        # dtype were ignored), on inputs large enough to tell.
        if q.size * k.size > 1000 and k.shape[-1] > 8:
            unrounded = reference(q, k, v, **ref)[0]
            assert max_abs_error(out, unrounded) > 1e-4


def test_packed_batches():
    rng = np.random.default_rng(11)
    for trial, opts in enumerate([{}, {"causal": True}, {"window": (2, 1), "alibi": "given"},
                                  {"sinks": True, "softcap": 2.0, "causal": True}]):
        lens_q = [int(x) for x in rng.integers(0, 9, 4)]
        lens_k = [int(x) for x in rng.integers(0, 12, 4)]
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32 if trial % 2 else np.int64)
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        h, hkv, d, dv = 4, 2, 16, 8
        qs = (h, int(cu_q[-1]), d) if trial != 1 else (int(cu_q[-1]), d)
        ks = (hkv, int(cu_k[-1]), d) if trial != 1 else (int(cu_k[-1]), d)
        vs = ks[:-1] + (dv,)
        (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts)
        result = qkv.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True,
                               **kw)
        out, lse = reference_packed(q, k, v, cu_q, cu_k, **ref)
        assert max_abs_error(result.out, out) <= F32_TOL * scale_of(out)
        assert max_abs_error(result.lse, lse) <= F32_TOL * scale_of(lse)


def test_fully_masked_rows():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, (2, 4, 8)), rand(rng, (2, 6, 8)), rand(rng, (2, 6, 5))
    mask = np.ones((2, 4, 6), dtype=bool)
    mask[0, 1] = False
    mask[1, 3] = False
    r = qkv.attention(q, k, v, attn_mask=mask, return_lse=True, return_weights=True)
    assert (r.out[0, 1] == 0).all() and (r.out[1, 3] == 0).all()
    assert (r.weights[0, 1] == 0).all() and r.lse[0, 1] == -np.inf and r.lse[1, 3] == -np.inf
    assert np.isfinite(r.lse[0, 0]) and not np.isnan(r.out).any()
    # A float mask of -inf does the same; with sinks the row's lse is the sink.
    fmask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    sinks = np.array([0.25, -1.5], dtype=np.float32)
    r = qkv.attention(q, k, v, attn_mask=fmask, sinks=sinks, return_lse=True,
                      return_weights=True)
    assert (r.out[0, 1] == 0).all() and (r.weights[1, 3] == 0).all()
    assert r.lse[0, 1] == np.float32(0.25) and r.lse[1, 3] == np.float32(-1.5)
    # A window that leaves the first rows no key (Nq > Nk, bottom-right causal).
    r = qkv.attention(rand(rng, (6, 4)), rand(rng, (3, 4)), rand(rng, (3, 2)), is_causal=True,
                      return_lse=True)
    assert (r.out[:3] == 0).all() and (r.lse[:3] == -np.inf).all() and np.isfinite(r.lse[3:]).all()


def test_default_scale_and_shapes_of_results():
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, (3, 5, 9)), rand(rng, (3, 7, 9)), rand(rng, (3, 7, 2))
    a = qkv.attention(q, k, v)
    b = qkv.attention(q, k, v, scale=1 / 3)
    assert np.array_equal(a, b)
    c = qkv.attention(q, k, v, scale=1.0)
    assert max_abs_error(c, reference(q, k, v, scale=1.0)[0]) <= F32_TOL * 2
    assert max_abs_error(a, c) > 1e-3
    assert isinstance(a, np.ndarray) and not isinstance(qkv.attention(q, k, v, return_lse=True),
                                                         np.ndarray)


@pytest.mark.parametrize("opts", [{}, {"causal": True, "sinks": True}, {"mask": "float"},
                                  {"alibi": "standard", "window": (5, 2)}])
def test_threads_bitwise_identical(opts):
    rng = np.random.default_rng(2)
    (q, k, v), kw, _ = make_call(rng, (2, 4, 150, 32), (2, 2, 170, 32), (2, 2, 170, 24), opts)
    results = [qkv.attention(q, k, v, threads=t, return_lse=True, return_weights=True, **kw)
               for t in (1, 2, 3)]
    for r in results[1:]:
        for got, want in zip(r, results[0]):
            assert np.array_equal(got, want, equal_nan=False)
            assert got.tobytes() == want.tobytes()


KERNEL_CASES = [
    ((4, 33, 24), (2, 47, 24), (2, 47, 16), {}),
    ((4, 1, 64), (2, 300, 64), (2, 300, 64), {"causal": True}),  # decode shape
    ((2, 3, 70, 40), (2, 3, 90, 40), (2, 3, 90, 40), {"mask": "float", "softcap": 2.0}),
    ((2, 19, 8), (2, 25, 8), (2, 25, 8), {"window": (4, 2), "sinks": True, "alibi": "given"}),
]


@pytest.mark.parametrize("kernel", qkv.kernel_names())
def test_every_kernel_agrees_with_reference(kernel):
    rng = np.random.default_rng(9)
    ran = 0
    for qs, ks, vs, opts in KERNEL_CASES:
        for dtype in (np.float32, np.float64):
            (q, k, v), kw, ref = make_call(rng, qs, ks, vs, opts, dtype)
            try:
                r = qkv.attention(q, k, v, kernel=kernel, return_lse=True, **kw)
            except qkv.Error as e:
                assert kernel in str(e), str(e)  # a decline names the kernel
                continue
            ran += 1
            tol = F64_TOL if dtype == np.float64 and kernel in ("reference",) else F32_TOL
            check(r, reference(q, k, v, **ref), tol, f"{kernel} {qs} {opts}")
    assert ran > 0, f"{kernel} declined every call"

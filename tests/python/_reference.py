"""A float64 NumPy statement of qkv.attention, written straight from the formulas of
include/qkv/attention.h, for the tests to compare against.

    s_ij = softcap(scale · q_i·k_j) + alibi_ij + float mask_ij,  softcap(x) = C·tanh(x / C),
    alibi_ij = -slope_h · |i + Nk - Nq - j|,
    key j allowed for query i iff the bool mask allows it, the float mask is not -inf there,
      j <= i + Nk - Nq when causal, and i + Nk - Nq - left <= j <= i + Nk - Nq + right,
    w_ij = exp(s_ij) / (exp(sink_h) + sum over allowed j of exp(s_ij)),  out_i = sum_j w_ij v_j,
    lse_i = log(exp(sink_h) + sum over allowed j of exp(s_ij));
    a row with no allowed key: out 0, weights 0, lse -inf (with sinks: lse = sink_h).
Query head h reads kv head h // (H // Hkv).
"""

import numpy as np


def bf16_round(x):
    """float32 values rounded to bfloat16 (nearest even), returned as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def reference(q, k, v, mask=None, causal=False, scale=None, window=None, softcap=None,
              alibi=None, sinks=None):
    """(out, lse, weights) in float64 for one unpacked call; shapes as qkv.attention's."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    rank = q.ndim
    lead = q.shape[:-2]
    pad = (1,) * (4 - rank)
    q4, k4, v4 = q.reshape(pad + q.shape), k.reshape(pad + k.shape), v.reshape(pad + v.shape)
    b, h, nq, d = q4.shape
    hkv, nk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    if scale is None:
        scale = 1.0 / np.sqrt(d) if d > 0 else 1.0
    heads = np.arange(h) // (h // hkv) if hkv > 0 else np.zeros(0, dtype=int)
    kh, vh = k4[:, heads], v4[:, heads]
    s = scale * np.einsum("bhqd,bhkd->bhqk", q4, kh)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    diag = i + (nk - nq)
    if alibi is not None:
        s = s - np.asarray(alibi, dtype=np.float64)[None, :, None, None] * np.abs(diag - j)
    allowed = np.ones(s.shape, dtype=bool)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask), lead + (nq, nk)).reshape(s.shape)
        if m.dtype == bool:
            allowed &= m
        else:
            m = m.astype(np.float64)
            allowed &= m != -np.inf
            s = s + np.where(m == -np.inf, 0.0, m)
    if causal:
        allowed &= j <= diag
    if window is not None:
        left, right = (-1 if x is None else x for x in window)
        if left != -1:
            allowed &= j >= diag - left
        if right != -1:
            allowed &= j <= diag + right
    s = np.where(allowed, s, -np.inf)
    row_max = s.max(axis=-1, initial=-np.inf)
    if sinks is not None:
        sink = np.asarray(sinks, dtype=np.float64)[None, :, None]
        row_max = np.maximum(row_max, sink)
    shift = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(allowed, np.exp(s - shift[..., None]), 0.0)
    denom = e.sum(axis=-1)
    if sinks is not None:
        denom = denom + np.exp(sink - shift)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(denom[..., None] > 0, e / denom[..., None], 0.0)
        lse = np.where(denom > 0, shift + np.log(denom), -np.inf)
    out = np.einsum("bhqk,bhkd->bhqd", w, vh)
    return (out.reshape(lead + (nq, dv)), lse.reshape(lead + (nq,)),
            w.reshape(lead + (nq, nk)))


def reference_packed(q, k, v, cu_q, cu_k, **options):
    """(out, lse) of a packed batch: each sequence b on its own rows, concatenated."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qs = q[..., cu_q[b]:cu_q[b + 1], :]
        ks = k[..., cu_k[b]:cu_k[b + 1], :]
        vs = v[..., cu_k[b]:cu_k[b + 1], :]
        out, lse, _ = reference(qs, ks, vs, **options)
        outs.append(out)
        lses.append(lse)
    return np.concatenate(outs, axis=-2), np.concatenate(lses, axis=-1)


def max_abs_error(computed, expected):
    """max |computed - expected| where equal infinities count as 0."""
    computed = np.asarray(computed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert computed.shape == expected.shape, (computed.shape, expected.shape)
    if computed.size == 0:
        return 0.0
    same = (computed == expected)
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(computed - expected))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def scale_of(expected):
    """max(1, max |expected| over finite values)."""
    expected = np.asarray(expected, dtype=np.float64)
    finite = expected[np.isfinite(expected)]
    return max(1.0, float(np.abs(finite).max())) if finite.size else 1.0


# float32 arithmetic: within 2e-6 of the float64 reference's scale (max |reference|); float64
# paths within 1e-12 of it.
F32_TOL = 2e-6
F64_TOL = 1e-12


def close(actual, expected, tol):
    """Asserts that actual is infinite exactly where expected is (an lse of -inf), and that
    max |actual - expected| <= tol · max |expected| over the finite rest (the tensor's scale)."""
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual, np.float64)
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), finite), "infinite in different places"
    assert np.array_equal(actual[~finite], expected[~finite]), "different infinities"
    scale = max(np.max(np.abs(expected[finite]), initial=0.0), 1e-300)
    error = np.max(np.abs(actual[finite] - expected[finite]), initial=0.0)
    assert error <= tol * scale, f"max error {error} > {tol} x scale {scale}"

"""qkv's bfloat16 backward from Python: its error against float64 autograd on the same
bf16-rounded inputs is held to at most twice the error of the same attention composed in plain
torch bfloat16 (autograd through bf16 matmuls and softmax), across masks, causal, grouped-query
heads, softcap, sinks and windows; bfloat16 gradients are the float32 ones rounded once;
NumPy callers get float32; qkv.torch runs the bf16 forward and backward for bf16 tensors and
under torch.autocast("cpu", dtype=torch.bfloat16), close to torch's own autocast result."""

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")
import qkv.torch as qt  # noqa: E402

# The criterion, FlashAttention's: at most twice the plain bf16 composition's error. Measured
# over CASES (every kernel, each gradient, torch 2.13): 0.27-0.82x (docs/python.md).
CRITERION = 2.0

CASES = {
    "plain": {},
    "causal": {"causal": True},
    "gqa_window": {"window": (40, 5), "heads": (4, 2)},
    "softcap_scale": {"softcap": 5.0, "scale": 0.3},
    "sinks_causal_gqa": {"sinks": True, "causal": True, "heads": (4, 1)},
    "float_mask": {"mask": "float"},
    "d128_causal": {"causal": True, "d": 128},
}


def bf16(t):
    return t.to(torch.bfloat16)


def make(case, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, hkv = case.get("heads", (2, 2))
    n, d = 150, case.get("d", 64)
    q = bf16(torch.randn(1, h, n, d, generator=g))
    k = bf16(torch.randn(1, hkv, n + 20, d, generator=g))
    v = bf16(torch.randn(1, hkv, n + 20, d, generator=g))
    dout = bf16(torch.randn(1, h, n, d, generator=g))
    sinks = bf16(torch.randn(h, generator=g)).float() if case.get("sinks") else None
    mask = None
    if case.get("mask") == "float":
        mask = bf16(torch.randn(n, n + 20, generator=g)).float()
        mask[mask < -1.5] = float("-inf")
    return q, k, v, dout, sinks, mask


def composition(q, k, v, mask=None, causal=False, scale=None, window=None, softcap=None,
                sinks=None):
    """Attention as plain torch composes it, in the tensors' dtype: scores by matmul, the
    score modifiers, torch.softmax (its bf16 output rounded from float32), the weights by
    matmul with V; autograd differentiates it op by op."""
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    nq, nk = q.shape[-2], k.shape[-2]
    i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    diag = i + (nk - nq)
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        allowed &= j <= diag
    if window is not None:
        allowed &= (j >= diag - window[0]) & (j <= diag + window[1])
    if mask is not None:
        allowed &= ~torch.isinf(mask)
        s = s + torch.where(torch.isinf(mask), torch.zeros_like(mask), mask)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(s.shape[:-1] + (1,))], dim=-1)
    w = torch.softmax(s, dim=-1)
    if sinks is not None:
        w = w[..., :-1]
    return w @ v


def gradients(case, q, k, v, dout, sinks, mask, dtype):
    """Autograd of torch_attention with every tensor in `dtype` (float64: the reference on the
    rounded values; bfloat16: the plain torch bf16 composition)."""
    leaves = [t.to(dtype, copy=True).requires_grad_() for t in (q, k, v)]
    s = sinks.to(dtype, copy=True).requires_grad_() if sinks is not None else None
    out = composition(*leaves, mask=None if mask is None else mask.to(dtype),
                          causal=case.get("causal", False), scale=case.get("scale"),
                          window=case.get("window"), softcap=case.get("softcap"), sinks=s)
    (out * dout.to(dtype)).sum().backward()
    return [t.grad.double() for t in leaves] + ([s.grad.double()] if s is not None else [])


def options_of(case, mask, sinks):
    return {"is_causal": case.get("causal", False), "window": case.get("window"),
            "softcap": case.get("softcap"), "scale": case.get("scale"), "attn_mask": mask,
            "sinks": sinks}


def max_error(a, b):
    return float((a.double() - b).abs().max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_bf16_backward_within_twice_the_torch_bf16_composition(name):
    case = CASES[name]
    q, k, v, dout, sinks, mask = make(case)
    ref = gradients(case, q, k, v, dout, sinks, mask, torch.float64)
    plain = gradients(case, q, k, v, dout, sinks, mask, torch.bfloat16)
    options = options_of(case, mask, sinks)
    fwd = qkv.attention(q, k, v, return_lse=True, **options)
    for kernel in qkv.backward_kernel_names():
        g = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout, kernel=kernel, **options)
        assert g.dq.dtype == g.dk.dtype == g.dv.dtype == torch.bfloat16
        got = [g.dq, g.dk, g.dv] + ([g.dsinks] if sinks is not None else [])
        for what, mine, theirs, want in zip(("dq", "dk", "dv", "dsinks"), got, plain, ref):
            scale = float(want.abs().max())
            assert max_error(mine, want) <= CRITERION * max_error(theirs, want) + 1e-6 * scale, (
                kernel, what, max_error(mine, want), max_error(theirs, want))


def test_bf16_gradients_are_the_float32_ones_rounded_once():
    q, k, v, dout, sinks, _ = make({"sinks": True}, seed=1)
    fwd = qkv.attention(q, k, v, return_lse=True, sinks=sinks, is_causal=True)
    g = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout, sinks=sinks, is_causal=True)
    f = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout, sinks=sinks, is_causal=True,
                               grad_dtype="float32")
    assert f.dq.dtype == torch.float32
    for a, b in zip(g, f):
        assert a.dtype == torch.bfloat16
        assert torch.equal(a, b.to(torch.bfloat16))
    # float32 inputs with dtype="bfloat16": the same computation on the rounded values.
    q32, k32, v32, do32 = (t.float() for t in (q, k, v, dout))
    g32 = qkv.attention_backward(q32, k32, v32, fwd.out, fwd.lse, do32, sinks=sinks,
                                 is_causal=True, dtype="bfloat16")
    for a, b in zip(g, g32):
        assert torch.equal(a, b)


def test_numpy_callers_get_float32_and_refusals_name_the_argument():
    q, k, v, dout, _, _ = make({}, seed=2)
    qn, kn, vn, don = (t.float().numpy() for t in (q, k, v, dout))
    fwd = qkv.attention(qn, kn, vn, return_lse=True, dtype="bfloat16")
    g = qkv.attention_backward(qn, kn, vn, fwd.out, fwd.lse, don, dtype="bfloat16")
    assert isinstance(g.dq, np.ndarray) and g.dq.dtype == np.float32
    # NumPy has no bfloat16: the float32 sums, which round to the torch call's bf16 gradients.
    t = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout)
    assert torch.equal(torch.from_numpy(g.dq).to(torch.bfloat16), t.dq)
    with pytest.raises(qkv.Error, match="^grad_dtype: NumPy has no bfloat16"):
        qkv.attention_backward(qn, kn, vn, fwd.out, fwd.lse, don, dtype="bfloat16",
                               grad_dtype="bfloat16")
    q32, k32, v32, do32 = (t.float() for t in (q, k, v, dout))
    with pytest.raises(qkv.Error, match="^grad_dtype: bfloat16 gradients come from a bfloat16"):
        qkv.attention_backward(q32, k32, v32, fwd.out, fwd.lse, do32, grad_dtype=torch.bfloat16)
    with pytest.raises(qkv.Error, match="^dtype: .*not float16"):
        qkv.attention_backward(qn, kn, vn, fwd.out, fwd.lse, don, dtype="float16")


def test_torch_attention_runs_the_bf16_backward_for_bf16_tensors():
    q, k, v, dout, _, _ = make({"heads": (4, 2)}, seed=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = qt.attention(*leaves, is_causal=True)
    assert out.dtype == torch.bfloat16
    (out * dout).sum().backward()
    # qkv.torch keeps the forward's float32 output for the backward (whose D = dO·O reads it):
    # the same call here.
    fwd = qkv.attention(q, k, v, is_causal=True, return_lse=True, out_dtype="float32")
    want = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout, is_causal=True)
    for leaf, expected in zip(leaves, want):
        assert leaf.grad.dtype == torch.bfloat16
        assert torch.equal(leaf.grad, expected)


@pytest.mark.parametrize("entry", ["attention", "sdpa"])
def test_autocast_runs_the_bf16_forward_and_backward(entry):
    """Under torch.autocast("cpu", dtype=torch.bfloat16) float32 q, k, v are cast to bf16 (as
    autocast casts them for torch's own SDPA): the output is bf16, the gradients reach the
    float32 leaves in float32, exactly qkv's bf16 gradients widened, and close to what torch's
    own SDPA gives under the same autocast."""
    g = torch.Generator().manual_seed(4)
    q32, k32, v32 = (torch.randn(2, 4, 96, 64, generator=g) for _ in range(3))
    dout = torch.randn(2, 4, 96, 64, generator=g)
    run = qt.attention if entry == "attention" else qt.scaled_dot_product_attention

    leaves = [t.clone().requires_grad_() for t in (q32, k32, v32)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(*leaves, is_causal=True)
    assert out.dtype == torch.bfloat16
    (out.float() * dout).sum().backward()
    assert all(leaf.grad.dtype == torch.float32 for leaf in leaves)

    qb, kb, vb = (bf16(t) for t in (q32, k32, v32))
    fwd = qkv.attention(qb, kb, vb, is_causal=True, return_lse=True, out_dtype="float32")
    want = qkv.attention_backward(qb, kb, vb, fwd.out, fwd.lse, bf16(dout), is_causal=True)
    for leaf, expected in zip(leaves, want):
        assert torch.equal(leaf.grad, expected.float())

    ref = [t.clone().requires_grad_() for t in (q32, k32, v32)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
    (theirs.float() * dout).sum().backward()
    out, theirs = out.detach().float(), theirs.detach().float()
    assert float((out - theirs).abs().max()) <= 2e-2 * float(theirs.abs().max())
    for mine, other in zip(leaves, ref):
        size = float(other.grad.abs().max())
        assert float((mine.grad - other.grad).abs().max()) <= 3e-2 * size

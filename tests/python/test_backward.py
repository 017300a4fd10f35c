"""qkv.attention_backward and qkv.torch: gradients against torch's autograd of attention written
out in float64 torch (the formulas of include/qkv/attention.h), gradcheck in float64, the
module's parameter gradients against the same layer in plain torch, and training."""

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")
import qkv.torch as qt  # noqa: E402


def torch_attention(q, k, v, mask=None, causal=False, scale=None, window=None, softcap=None,
                    sinks=None):
    """Attention in plain torch, differentiable: what the gradients are checked against."""
    d = q.shape[-1]
    scale = 1.0 / d ** 0.5 if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    s = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    nq, nk = q.shape[-2], k.shape[-2]
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    diag = i + (nk - nq)
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        allowed &= j <= diag
    if window is not None:
        left, right = window
        allowed &= (j >= diag - left) & (j <= diag + right)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            s = s + torch.where(torch.isinf(mask), torch.zeros_like(mask), mask)
            allowed = allowed & ~torch.isinf(mask)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks[:, None, None].expand(s.shape[:-1] + (1,))
        s = torch.cat([s, sink], dim=-1)
    row_max = s.max(dim=-1, keepdim=True).values.clamp(min=-1e300)
    e = torch.exp(s - row_max)
    w = e / e.sum(dim=-1, keepdim=True).clamp(min=1e-300)
    if sinks is not None:
        w = w[..., :-1]
    return w @ v


CASES = {
    "plain": {},
    "causal": {"causal": True},
    "gqa_window": {"window": (2, 1), "heads": (4, 2)},
    "softcap_scale": {"softcap": 1.5, "scale": 0.8},
    "sinks_causal": {"sinks": True, "causal": True},
    "float_mask": {"mask": "float"},
}


def inputs(case, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, hkv = case.get("heads", (2, 2))
    q = torch.randn(2, h, 5, 4, generator=g, dtype=dtype)
    k = torch.randn(2, hkv, 7, 4, generator=g, dtype=dtype)
    v = torch.randn(2, hkv, 7, 3, generator=g, dtype=dtype)
    dout = torch.randn(2, h, 5, 3, generator=g, dtype=dtype)
    sinks = torch.randn(h, generator=g, dtype=dtype) if case.get("sinks") else None
    mask = None
    if case.get("mask") == "float":
        mask = torch.randn(5, 7, generator=g, dtype=dtype)
        mask[mask < -1.0] = float("-inf")
    return q, k, v, dout, sinks, mask


def options_of(case, mask, sinks):
    return {"is_causal": case.get("causal", False), "window": case.get("window"),
            "softcap": case.get("softcap"), "scale": case.get("scale"), "attn_mask": mask,
            "sinks": sinks}


def torch_gradients(case, q, k, v, dout, sinks, mask):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = sinks.clone().requires_grad_() if sinks is not None else None
    out = torch_attention(*leaves, mask=mask, causal=case.get("causal", False),
                          scale=case.get("scale"), window=case.get("window"),
                          softcap=case.get("softcap"), sinks=s)
    (out * dout).sum().backward()
    return [t.grad for t in leaves] + [s.grad if s is not None else None]


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_backward_matches_torch_autograd(name):
    case = CASES[name]
    q, k, v, dout, sinks, mask = inputs(case)
    expected = torch_gradients(case, q, k, v, dout, sinks, mask)
    options = options_of(case, mask, sinks)
    r = qkv.attention(q, k, v, return_lse=True, **options)
    g = qkv.attention_backward(q, k, v, r.out, r.lse, dout, **options)
    assert g.dq.dtype == torch.float64  # torch in, torch out
    for got, want in zip((g.dq, g.dk, g.dv), expected[:3]):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
    if sinks is None:
        assert g.dsinks is None
    else:
        np.testing.assert_allclose(g.dsinks, expected[3].numpy(), rtol=1e-10, atol=1e-12)
    # float32: every backward kernel within float32's accuracy of float64's answer
    q32, k32, v32, do32 = (t.float() for t in (q, k, v, dout))
    s32 = sinks.float() if sinks is not None else None
    m32 = mask.float() if mask is not None else None
    options32 = options_of(case, m32, s32)
    r32 = qkv.attention(q32, k32, v32, return_lse=True, **options32)
    for kernel in qkv.backward_kernel_names():
        g32 = qkv.attention_backward(q32, k32, v32, r32.out, r32.lse, do32, kernel=kernel,
                                     **options32)
        assert g32.dq.dtype == torch.float32
        for got, want in zip((g32.dq, g32.dk, g32.dv), expected[:3]):
            scale = max(1.0, float(want.abs().max()))
            assert np.abs(got.numpy() - want.numpy()).max() <= 2e-5 * scale, kernel


def test_attention_backward_refuses_with_one_line_naming_the_argument():
    q, k, v, dout, _, _ = inputs({}, dtype=torch.float32)
    r = qkv.attention(q, k, v, return_lse=True)
    with pytest.raises(qkv.Error, match="grad_out"):
        qkv.attention_backward(q, k, v, r.out, r.lse, dout[..., :2])
    with pytest.raises(qkv.Error, match="dtype"):
        qkv.attention_backward(q, k, v, r.out, r.lse, dout, dtype="float16")
    with pytest.raises(qkv.Error, match="lse"):
        qkv.attention_backward(q, k, v, r.out, r.lse[..., :3], dout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_attention_is_gradcheck_clean(name):
    case = CASES[name]
    q, k, v, _, sinks, mask = inputs(case)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    args = leaves + ([sinks.clone().requires_grad_()] if sinks is not None else [])

    def f(q_, k_, v_, *s):
        return qt.attention(q_, k_, v_, attn_mask=mask, is_causal=case.get("causal", False),
                            window=case.get("window"), softcap=case.get("softcap"),
                            scale=case.get("scale"), sinks=s[0] if s else None)

    assert torch.autograd.gradcheck(f, tuple(args))


def test_torch_attention_honours_requires_grad():
    q, k, v, dout, _, _ = inputs({})
    q.requires_grad_()
    out = qt.attention(q, k, v)
    assert out.dtype == torch.float64 and out.requires_grad
    (out * dout).sum().backward()
    assert q.grad is not None and k.grad is None and v.grad is None
    assert not qt.attention(k[:, :, :5], k, v).requires_grad


def test_multihead_attention_gradients_equal_plain_torch_and_it_trains():
    torch.manual_seed(0)
    layer = qt.MultiheadAttention(8, 4, kv_heads=2, dtype=torch.float64)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    target = torch.randn(2, 6, 8, dtype=torch.float64)
    loss = ((layer(x, is_causal=True) - target) ** 2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    # The same layer in plain torch, the same weights.
    params = {n: p.detach().clone().requires_grad_() for n, p in layer.named_parameters()}

    def heads(y, n):
        return y.unflatten(-1, (n, 2)).transpose(-3, -2)

    q = heads(x @ params["wq"] + params["bq"], 4)
    k = heads(x @ params["wk"] + params["bk"], 2)
    v = heads(x @ params["wv"] + params["bv"], 2)
    o = torch_attention(q, k, v, causal=True).transpose(-3, -2).flatten(-2)
    plain = ((o @ params["wo"] + params["bo"] - target) ** 2).mean()
    plain.backward()
    assert abs(plain.item() - loss.item()) < 1e-12
    for n, p in params.items():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-10, atol=1e-12)
    # A few Adam steps on a fixed batch lower the loss.
    layer32 = qt.MultiheadAttention(8, 2)
    x32, t32 = x.float(), target.float()
    opt = torch.optim.Adam(layer32.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        step = ((layer32(x32) - t32) ** 2).mean()
        step.backward()
        opt.step()
        losses.append(step.item())
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("dtype", [torch.float16])
def test_torch_attention_differentiates_16_bit_inputs_in_float32(dtype):
    """qkv has no float16 backward: qkv.torch runs the float16 forward (its kernel), then the
    float32 backward on the float16 inputs as stored, and rounds the gradients to their dtype.
    So the gradients are exactly the float32 backward's on those values, rounded once.
    (bfloat16 has a backward of its own: test_backward_bf16.py.)"""
    q, k, v, dout, _, _ = inputs({"causal": True}, dtype=torch.float32, seed=3)
    q16, k16, v16 = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = qt.attention(q16, k16, v16, is_causal=True)
    assert out.dtype == dtype
    (out * dout.to(dtype)).sum().backward()
    stored = [t.detach() for t in (q16, k16, v16)]
    fwd = qkv.attention(*stored, is_causal=True, out_dtype="float32", return_lse=True)
    assert torch.equal(out, fwd.out.to(dtype))  # the 16-bit output: the float32 one, rounded
    # The float32 backward on the 16-bit values, given as float32 copies of them.
    want = qkv.attention_backward(*(t.float() for t in stored), fwd.out, fwd.lse,
                                  dout.to(dtype).float(), is_causal=True, dtype="float32")
    for got, expected in zip((q16.grad, k16.grad, v16.grad), want[:3]):
        assert got.dtype == dtype
        assert torch.equal(got, expected.to(dtype))


def test_a_second_derivative_is_refused_never_silently_zero():
    """qkv's backward is not differentiable. A gradient taken with create_graph=True (to be
    differentiated again: a gradient penalty) treated qkv's gradients as constants, and the
    penalty's gradient came out 0 where plain torch gives a non-zero one. It is refused."""
    q, k, v, dout, _, _ = inputs({"causal": True}, seed=5)
    leaf = q.clone().requires_grad_()
    plain = torch_attention(leaf, k, v, causal=True)
    (dq_plain,) = torch.autograd.grad((plain * dout).sum(), leaf, create_graph=True)
    (penalty_grad,) = torch.autograd.grad((dq_plain ** 2).sum(), leaf)
    assert penalty_grad.abs().max() > 1e-3  # what a silent zero would get wrong

    leaf = q.clone().requires_grad_()
    out = qt.attention(leaf, k, v, is_causal=True)
    with pytest.raises(qkv.Error, match="no second derivative.*create_graph=True"):
        torch.autograd.grad((out * dout).sum(), leaf, create_graph=True)
    out = qt.attention(leaf, k, v, is_causal=True)
    with pytest.raises(qkv.Error, match="no second derivative"):
        (out * dout).sum().backward(create_graph=True)
    with pytest.raises(qkv.Error, match="no second derivative"):
        out = qt.scaled_dot_product_attention(leaf, k, v)
        torch.autograd.grad(out.sum(), leaf, create_graph=True)
    # The first derivative is as before.
    out = qt.attention(leaf, k, v, is_causal=True)
    (dq,) = torch.autograd.grad((out * dout).sum(), leaf)
    assert torch.allclose(dq, dq_plain.detach(), atol=1e-12)


def test_numpy_sinks_take_no_gradient_and_the_rest_train():
    """sinks given as a NumPy array beside tensors that require grad: the array is a constant
    (it cannot require grad), the other gradients are those of the same sinks as a tensor. It
    raised torch's TypeError from save_for_backward."""
    q, k, v, dout, _, _ = inputs({}, seed=6)
    sinks = np.array([0.5, -1.0])
    grads = []
    for given in (sinks, torch.from_numpy(sinks)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = qt.attention(*leaves, sinks=given)
        (out * dout).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, expected in zip(*grads):
        assert torch.equal(got, expected)
    with pytest.raises(qkv.Error, match="sinks"):
        qt.attention(q.clone().requires_grad_(), k, v, sinks=object())


def test_zero_query_heads_with_empty_sinks_give_an_empty_sinks_gradient():
    """H = 0 with sinks of shape [0]: dsinks is an empty [0] array (it was None in Python, and
    qkv.torch raised a TypeError)."""
    q = np.zeros((0, 4, 8), np.float32)
    k = np.zeros((0, 5, 8), np.float32)
    v = np.zeros((0, 5, 3), np.float32)
    sinks = np.zeros(0, np.float32)
    r = qkv.attention(q, k, v, sinks=sinks, return_lse=True)
    g = qkv.attention_backward(q, k, v, r.out, r.lse, np.zeros((0, 4, 3), np.float32),
                               sinks=sinks)
    assert isinstance(g.dsinks, np.ndarray) and g.dsinks.shape == (0,)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    ts = torch.zeros(0, requires_grad=True)
    qt.attention(tq, tk, tv, sinks=ts).sum().backward()
    assert ts.grad is not None and ts.grad.shape == (0,)
    assert tq.grad.shape == (0, 4, 8)


def _float32_composition(q, k, v, dout, scale):
    """The plain float32 composition torch's autograd runs: S = Q·Kᵀ, softmax, and its backward
    (dV = Pᵀ·dO, dS = P∘(dP - Σ P∘dP), dQ = scale·dS·K, dK = scale·dSᵀ·Q)."""
    q, k, v, dout = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v, dout))
    s = scale * (q @ k.transpose(-1, -2))
    out = torch.softmax(s, dim=-1) @ v
    out.backward(dout)
    return [t.grad.double().numpy() for t in (q, k, v)]


@pytest.mark.parametrize("score", [1e1, 4e4, 3e5, 1e7])
def test_float32_gradients_stay_within_twice_the_plain_composition_as_scores_grow(score):
    # Weights recomputed as exp(s - lse) from the saved lse lost 4e-4 of dV's size at scores of
    # 4e4 and more than all of it at 3e7, where the composition stays near 3e-8: the kernels now
    # compute each row's max and sum themselves, from the same scores.
    rng = np.random.default_rng(5)
    h, n, d = 2, 48, 32
    q = rng.uniform(-1, 1, (h, n, d))
    k = rng.uniform(-1, 1, (h, n, d))
    scale = 1.0 / d ** 0.5
    f = (score / np.abs(scale * q @ k.transpose(0, 2, 1)).max()) ** 0.5
    q, k = (np.float32(f) * x.astype(np.float32) for x in (q, k))
    v = rng.uniform(-1, 1, (h, n, d)).astype(np.float32)
    dout = rng.uniform(-1, 1, (h, n, d)).astype(np.float32)
    r = qkv.attention(q, k, v, return_lse=True)
    exact = qkv.attention_backward(*(x.astype(np.float64) for x in (q, k, v)),
                                   r.out.astype(np.float64), r.lse.astype(np.float64),
                                   dout.astype(np.float64), kernel="reference")
    composition = _float32_composition(q, k, v, dout, scale)
    for kernel in qkv.backward_kernel_names():
        g = qkv.attention_backward(q, k, v, r.out, r.lse, dout, kernel=kernel)
        for name, got, want, plain in zip("qkv", (g.dq, g.dk, g.dv),
                                          (exact.dq, exact.dk, exact.dv), composition):
            size = np.abs(want).max()
            error = np.abs(got.astype(np.float64) - want).max()
            plain_error = np.abs(plain - want).max()
            # twice the composition's error (3x past scores of 1e3, where S's own rounding
            # dominates both: tests/kernels/backward_precision_test.cc), plus one rounding
            factor = 2.0 if score <= 1e3 else 3.0
            assert error <= factor * plain_error + size * 2.0 ** -24, (
                f"{kernel} d{name}: error {error:.3g}, composition {plain_error:.3g}, "
                f"size {size:.3g}")


def test_torch_attention_gradients_stay_accurate_at_large_scores():
    # qkv.torch's backward is the same kernels: at scores of 3e5 its gradients stay within 3x
    # the float32 composition's error (the bound past scores of 1e3; weighed from the saved lse
    # dQ erred 1e-4 where the composition errs 0).
    gen = torch.Generator().manual_seed(3)
    shape = (1, 2, 64, 32)
    q, k, v, dout = (torch.rand(*shape, generator=gen) * 2 - 1 for _ in range(4))
    scale = 32 ** -0.5
    f = (3e5 / (scale * (q @ k.transpose(-1, -2))).abs().max()) ** 0.5
    q, k = q * f, k * f
    grads = []
    for dtype in (torch.float32, torch.float64):
        leaves = [t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v)]
        qt.attention(*leaves).backward(dout.to(dtype))
        grads.append([t.grad.double().numpy() for t in leaves])
    plain = _float32_composition(*(t.numpy() for t in (q, k, v, dout)), scale)
    for name, got, want, composition in zip("qkv", grads[0], grads[1], plain):
        error = np.abs(got - want).max()
        plain_error = np.abs(composition - want).max()
        # plus one rounding of the largest element, and 1e-30: at these scores the non-top
        # weights underflow, and dQ is a sum of float32 subnormals (1e-38 here)
        atol = max(np.abs(want).max() * 2.0 ** -24, 1e-30)
        assert error <= 3.0 * plain_error + atol, (
            f"d{name}: error {error:.3g}, composition {plain_error:.3g}")

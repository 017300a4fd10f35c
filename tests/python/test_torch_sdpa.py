"""qkv.attention on torch tensors against torch's own attention (PyPI's torch 2.13:
torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
scale=, enable_gqa=); bool masks True = may attend; causal aligned top-left). Tolerance: float32
<= 2e-6 · max(1, max |expected|); float64 <= 1e-12 relative. qkv.torch.scaled_dot_product_attention
itself is held against torch in test_torch_sdpa_port.py."""

import numpy as np
import pytest

import qkv
from _reference import bf16_round, max_abs_error, reference, scale_of

torch = pytest.importorskip("torch", reason="torch is not installed")
F = torch.nn.functional
TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def torch_math(q, k, v, mask=None, scale=None):
    """softmax(q·kᵀ·scale + mask)·v in torch (a bool mask: False -> -inf)."""
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            s = s.masked_fill(~mask, float("-inf"))
        else:
            s = s + mask
    return torch.softmax(s, dim=-1) @ v


def close(got, want, dtype):
    got = got.numpy() if isinstance(got, torch.Tensor) else got
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    err = max_abs_error(got, want)
    assert err <= TOL[dtype] * scale_of(want), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_against_torch_math(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 17, 24, generator=g, dtype=dtype)
    k = torch.randn(2, 3, 29, 24, generator=g, dtype=dtype)
    v = torch.randn(2, 3, 29, 12, generator=g, dtype=dtype)
    out = qkv.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype  # torch in, torch out
    close(out, torch_math(q, k, v), dtype)
    fmask = torch.randn(17, 29, generator=g, dtype=dtype)
    close(qkv.attention(q, k, v, attn_mask=fmask, scale=0.5), torch_math(q, k, v, fmask, 0.5),
          dtype)
    bmask = torch.rand(3, 17, 29, generator=g) < 0.6
    bmask[..., 0] = True  # no fully masked row (the plain softmax above gives NaN there)
    close(qkv.attention(q, k, v, attn_mask=bmask), torch_math(q, k, v, bmask), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_against_torch_sdpa(dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 20, 16, generator=g, dtype=dtype)
    k = torch.randn(2, 4, 20, 16, generator=g, dtype=dtype)
    v = torch.randn(2, 4, 20, 8, generator=g, dtype=dtype)
    r = qkv.attention(q, k, v, return_weights=True)
    close(r.out, F.scaled_dot_product_attention(q, k, v), dtype)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
    close(r.weights, weights, dtype)
    bmask = torch.rand(20, 20, generator=g) < 0.5
    bmask[:, 3] = True
    close(qkv.attention(q, k, v, attn_mask=bmask),
          F.scaled_dot_product_attention(q, k, v, attn_mask=bmask), dtype)
    # Nq == Nk: causal is the lower triangle in both.
    close(qkv.attention(q, k, v, is_causal=True),
          F.scaled_dot_product_attention(q, k, v, is_causal=True), dtype)


def test_causal_bottom_right_vs_torch_top_left():
    """Nq != Nk: qkv.attention aligns causal bottom-right (key j allowed iff j <= i + Nk - Nq),
    torch top-left (j <= i). qkv equals torch given the bottom-right mask explicitly, and
    differs from torch's own is_causal."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k = torch.randn(1, 2, 9, 8, generator=g)
    v = torch.randn(1, 2, 9, 8, generator=g)
    i = torch.arange(5)[:, None]
    j = torch.arange(9)[None, :]
    bottom_right = j <= i + (9 - 5)
    ours = qkv.attention(q, k, v, is_causal=True)
    close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right), torch.float32)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_abs_error(ours.numpy(), top_left.numpy()) > 1e-2
    close(ours[..., -1, :], torch_math(q, k, v)[..., -1, :], torch.float32)  # last row: all keys


def test_float16_and_bfloat16_tensors():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, 16, generator=g) for _ in range(3))
    out = qkv.attention(q.half(), k.half(), v.half())
    assert out.dtype == torch.float16
    want = reference(q.half().numpy(), k.half().numpy(), v.half().numpy())[0]
    assert (np.abs(out.numpy() - want) <= 2.0**-11 * np.abs(want) + 2e-6 * scale_of(want)).all()
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    wide = qkv.attention(qb, kb, vb, out_dtype="float32")
    assert wide.dtype == torch.float32
    want = reference(*(bf16_round(t.numpy()) for t in (q, k, v)))[0]
    # bf16 compute rounds the weights to bf16 before P·V: <= 2^-9 · max |v| (test_attention).
    assert max_abs_error(wide.numpy(), want) <= 2.0**-9 * max(1.0, float(v.abs().max())) + 2e-6
    # The bits were read as bfloat16, not reinterpreted: torch agrees within bf16 rounding.
    assert max_abs_error(wide.numpy(), torch_math(q, k, v).numpy()) < 2e-2
    # torch.bfloat16 in: a torch.bfloat16 out, the float32 output rounded once.
    out = qkv.attention(qb, kb, vb)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, wide.to(torch.bfloat16))
    assert torch.equal(qkv.attention(q, k, v, dtype="bfloat16", out_dtype=torch.bfloat16),
                       qkv.attention(q, k, v, dtype="bfloat16").to(torch.bfloat16))


def test_non_contiguous_tensors_read_in_place():
    g = torch.Generator().manual_seed(4)
    # [B, N, H, D] as models lay it out, attended as [B, H, N, D] views (no copy).
    q = torch.randn(2, 13, 4, 16, generator=g).transpose(1, 2)
    k = torch.randn(2, 21, 4, 16, generator=g).transpose(1, 2)
    v = torch.randn(2, 21, 4, 16, generator=g).transpose(1, 2)
    assert not q.is_contiguous()
    from qkv._arrays import as_input
    assert np.shares_memory(as_input(q), q.numpy())  # the view qkv reads is q's memory
    out = qkv.attention(q, k, v, is_causal=True)
    contiguous = qkv.attention(q.contiguous(), k.contiguous(), v.contiguous(), is_causal=True)
    assert torch.equal(out, contiguous)
    close(out, torch_math(q, k, v, torch.ones(13, 21, dtype=torch.bool).tril(21 - 13)),
          torch.float32)


def test_requires_grad_tensor_is_refused_while_autograd_records():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 7, 8, generator=g, requires_grad=True)
    k, v = torch.randn(3, 7, 8, generator=g), torch.randn(3, 7, 8, generator=g)
    with pytest.raises(qkv.Error) as raised:
        qkv.attention(q, k, v)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("q: requires grad; qkv.attention does not differentiate")
    assert "qkv.torch.attention" in message
    # No graph is being built: read as any other tensor, and q is left as it was.
    with torch.no_grad():
        out = qkv.attention(q, k, v)
    close(out, torch_math(q.detach(), k, v), torch.float32)
    with torch.inference_mode():
        assert torch.equal(qkv.attention(q, k, v), out)
    assert torch.equal(qkv.attention(q.detach(), k, v), out)
    assert q.requires_grad and q.grad is None

"""qkv.attention on torch tensors against torch's own attention (Debian's torch 1.13:
torch.nn.functional._scaled_dot_product_attention(q, k, v, attn_mask, dropout_p,
need_attn_weights, is_causal) -> (out, weights); bool masks True = may attend; causal aligned
top-left). Tolerance: float32 <= 2e-6 · max(1, max |expected|); float64 <= 1e-12 relative."""

import numpy as np
import pytest

import qkv
from _reference import bf16_round, max_abs_error, reference, scale_of

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
F = torch.nn.functional
SDPA = getattr(F, "_scaled_dot_product_attention", None)
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
    assert out.dtype == (np.float64 if dtype == torch.float64 else np.float32)
    close(out, torch_math(q, k, v), dtype)
    fmask = torch.randn(17, 29, generator=g, dtype=dtype)
    close(qkv.attention(q, k, v, attn_mask=fmask, scale=0.5), torch_math(q, k, v, fmask, 0.5),
          dtype)
    bmask = torch.rand(3, 17, 29, generator=g) < 0.6
    bmask[..., 0] = True  # no fully masked row (torch gives NaN there)
    close(qkv.attention(q, k, v, attn_mask=bmask), torch_math(q, k, v, bmask), dtype)


@pytest.mark.skipif(SDPA is None, reason="torch has no _scaled_dot_product_attention")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_against_torch_sdpa(dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 20, 16, generator=g, dtype=dtype)
    k = torch.randn(2, 4, 20, 16, generator=g, dtype=dtype)
    v = torch.randn(2, 4, 20, 8, generator=g, dtype=dtype)
    out, weights = SDPA(q, k, v, None, 0.0, True, False)
    r = qkv.attention(q, k, v, return_weights=True)
    close(r.out, out, dtype)
    close(r.weights, weights, dtype)
    bmask = torch.rand(20, 20, generator=g) < 0.5
    bmask[:, 3] = True
    close(qkv.attention(q, k, v, attn_mask=bmask), SDPA(q, k, v, bmask, 0.0, False, False)[0],
          dtype)
    # Nq == Nk: causal is the lower triangle in both.
    close(qkv.attention(q, k, v, is_causal=True), SDPA(q, k, v, None, 0.0, False, True)[0], dtype)


@pytest.mark.skipif(SDPA is None, reason="torch has no _scaled_dot_product_attention")
def test_causal_bottom_right_vs_torch_top_left():
    """Nq != Nk: qkv aligns causal bottom-right (key j allowed iff j <= i + Nk - Nq), torch
    top-left (j <= i). qkv equals torch given the bottom-right mask explicitly, and differs
    from torch's own is_causal."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 5, 8, generator=g)
    k = torch.randn(1, 2, 9, 8, generator=g)
    v = torch.randn(1, 2, 9, 8, generator=g)
    i = torch.arange(5)[:, None]
    j = torch.arange(9)[None, :]
    bottom_right = j <= i + (9 - 5)
    ours = qkv.attention(q, k, v, is_causal=True)
    close(ours, SDPA(q, k, v, bottom_right, 0.0, False, False)[0], torch.float32)
    top_left = SDPA(q, k, v, None, 0.0, False, True)[0].numpy()
    assert max_abs_error(ours, top_left) > 1e-2
    close(ours[..., -1, :], torch_math(q, k, v)[..., -1, :], torch.float32)  # last row: all keys


def test_float16_and_bfloat16_tensors():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, 16, generator=g) for _ in range(3))
    out = qkv.attention(q.half(), k.half(), v.half())
    assert out.dtype == np.float16
    want = reference(q.half().numpy(), k.half().numpy(), v.half().numpy())[0]
    assert (np.abs(out - want) <= 2.0**-11 * np.abs(want) + 2e-6 * scale_of(want)).all()
    out = qkv.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == np.float32
    want = reference(*(bf16_round(t.numpy()) for t in (q, k, v)))[0]
    # bf16 compute rounds the weights to bf16 before P·V: <= 2^-9 · max |v| (test_attention).
    assert max_abs_error(out, want) <= 2.0**-9 * max(1.0, float(v.abs().max())) + 2e-6
    # The bits were read as bfloat16, not reinterpreted: torch agrees within bf16 rounding.
    assert max_abs_error(out, torch_math(q, k, v).numpy()) < 2e-2


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
    assert np.array_equal(out, contiguous)
    close(out, torch_math(q, k, v, torch.ones(13, 21, dtype=torch.bool).tril(21 - 13)),
          torch.float32)


def test_requires_grad_tensor():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 7, 8, generator=g, requires_grad=True)
    k, v = torch.randn(3, 7, 8, generator=g), torch.randn(3, 7, 8, generator=g)
    out = qkv.attention(q, k, v)
    close(out, torch_math(q.detach(), k, v), torch.float32)
    assert q.requires_grad and q.grad is None

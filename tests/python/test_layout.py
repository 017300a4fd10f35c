"""layout="bnhd": q, k, v (and out, grad_out, the gradients) as [.., N, H, D], the order of
transformers and flash-attn, read as strided views; the same bits as the heads-first call on
the same numbers, as `qkv attention --layout bnhd`."""

import numpy as np
import pytest

import qkv


def heads_first(x):
    return np.ascontiguousarray(np.swapaxes(x, -3, -2))


def inputs(shape_q, shape_kv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q, dtype=np.float32)
    k = rng.standard_normal(shape_kv, dtype=np.float32)
    v = rng.standard_normal(shape_kv, dtype=np.float32)
    return q, k, v


@pytest.mark.parametrize("shape_q, shape_kv", [((2, 12, 4, 16), (2, 9, 2, 16)),
                                               ((12, 4, 16), (12, 4, 16))])
def test_tokens_first_gives_the_heads_first_answer_in_its_own_order(shape_q, shape_kv):
    q, k, v = inputs(shape_q, shape_kv)
    want = qkv.attention(heads_first(q), heads_first(k), heads_first(v), is_causal=True,
                         return_lse=True)
    got = qkv.attention(q, k, v, is_causal=True, return_lse=True, layout="bnhd")
    assert got.out.shape == shape_q
    np.testing.assert_array_equal(got.out, np.swapaxes(want.out, -3, -2))
    np.testing.assert_array_equal(got.lse, want.lse)  # [.., H, Nq] either way
    qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
    np.testing.assert_array_equal(qkv.attention(qh, kh, vh, is_causal=True, layout="bhnd"),
                                  want.out)

    grad = np.random.default_rng(1).standard_normal(shape_q, dtype=np.float32)
    g_want = qkv.attention_backward(heads_first(q), heads_first(k), heads_first(v), want.out,
                                    want.lse, heads_first(grad), is_causal=True)
    g_got = qkv.attention_backward(q, k, v, got.out, got.lse, grad, is_causal=True,
                                   layout="bnhd")
    for name, a, b in zip("qkv", g_got[:3], g_want[:3]):
        assert a.shape == (q, k, v)["qkv".index(name)].shape, name
        np.testing.assert_array_equal(a, np.swapaxes(b, -3, -2), err_msg="d" + name)


def test_torch_tensors_in_tokens_first_come_back_so():
    torch = pytest.importorskip("torch")
    q, k, v = inputs((2, 10, 4, 8), (2, 10, 4, 8), seed=2)
    got = qkv.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                        layout="bnhd")
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 10, 4, 8)
    want = qkv.attention(heads_first(q), heads_first(k), heads_first(v))
    np.testing.assert_array_equal(got.numpy(), np.swapaxes(want, -3, -2))


def test_an_unknown_layout_is_refused():
    q, k, v = inputs((4, 2, 8), (4, 2, 8))
    with pytest.raises(qkv.Error, match="layout: expected 'bhnd'"):
        qkv.attention(q, k, v, layout="nhd")

"""Torch in, torch out: every function of qkv hands back torch tensors when any array argument
is a torch tensor (sharing the memory qkv allocated: no copy), NumPy arrays for NumPy arrays;
and refuses a tensor that requires grad while autograd records (plain qkv does not
differentiate), but reads one under torch.no_grad() or torch.inference_mode()."""

import numpy as np
import pytest

import qkv
from qkv import _qkv

torch = pytest.importorskip("torch")


def tensors(*shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype) for shape in shapes]


def one_line_refusal(call, name, caller):
    with pytest.raises(qkv.Error) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message, message
    assert message.startswith(f"{name}: requires grad; {caller} does not differentiate"), message


def test_attention_numpy_in_numpy_out_torch_in_torch_out():
    q, k, v = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4))
    numpy_out = qkv.attention(q.numpy(), k.numpy(), v.numpy())
    assert type(numpy_out) is np.ndarray
    out = qkv.attention(q, k, v)
    assert type(out) is torch.Tensor and out.dtype == torch.float32 and out.device.type == "cpu"
    assert np.array_equal(out.numpy(), numpy_out)
    r = qkv.attention(q, k, v, return_lse=True, return_weights=True)
    assert all(type(t) is torch.Tensor for t in r)
    assert r.lse.shape == (2, 5) and r.weights.shape == (2, 5, 7)
    # Any torch argument decides: a NumPy q with torch k, or only a torch mask.
    assert type(qkv.attention(q.numpy(), k, v.numpy())) is torch.Tensor
    mask = torch.ones(5, 7, dtype=torch.bool)
    assert type(qkv.attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask)) is torch.Tensor
    assert type(qkv.attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask.numpy())) \
        is np.ndarray


def test_torch_outputs_share_the_memory_qkv_allocated(monkeypatch):
    """No copy on the way out: the tensor is the extension's NumPy array, viewed by torch."""
    q, k, v = tensors((2, 64, 16), (2, 64, 16), (2, 64, 16))
    made = []
    real = _qkv.attention

    def recording(*args):
        result = real(*args)
        made.append(result)
        return result

    monkeypatch.setattr(_qkv, "attention", recording)
    r = qkv.attention(q, k, v, return_lse=True)
    out_array, lse_array = made[0][0], made[0][1]
    assert np.shares_memory(r.out.numpy(), out_array)
    assert np.shares_memory(r.lse.numpy(), lse_array)


def test_attention_backward_returns_torch_gradients():
    q, k, v, dout = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4), (2, 5, 4), dtype=torch.float64)
    fwd = qkv.attention(q, k, v, return_lse=True)
    g = qkv.attention_backward(q, k, v, fwd.out, fwd.lse, dout)
    assert all(type(t) is torch.Tensor for t in (g.dq, g.dk, g.dv)) and g.dsinks is None
    plain = qkv.attention_backward(*(t.numpy() for t in (q, k, v, fwd.out, fwd.lse, dout)))
    assert all(type(a) is np.ndarray for a in plain[:3])
    for got, want in zip(g[:3], plain[:3]):
        assert np.array_equal(got.numpy(), want)
    one_line_refusal(lambda: qkv.attention_backward(q, k, v, fwd.out, fwd.lse,
                                                    dout.clone().requires_grad_()),
                     "grad_out", "qkv.attention_backward")


def test_bfloat16_output_only_for_torch():
    q, k, v = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4))
    with pytest.raises(qkv.Error, match="^out_dtype: NumPy has no bfloat16"):
        qkv.attention(q.numpy(), k.numpy(), v.numpy(), out_dtype="bfloat16")
    out = qkv.attention(q, k, v, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, qkv.attention(q, k, v).to(torch.bfloat16))


def test_every_output_of_a_16_bit_call_has_the_inputs_dtype():
    """bfloat16 inputs gave a bfloat16 output but float32 lse and weights, while float16 inputs
    gave float16 for all three: each output now has the inputs' dtype, for both 16-bit types,
    in qkv.attention and the layer."""
    q, k, v = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4))
    x = torch.randn(5, 8)
    w = torch.randn(8, 8) / 4
    layer = qkv.MultiHeadAttention(w, w, w, heads=2)
    for dtype in (torch.bfloat16, torch.float16):
        r = qkv.attention(q.to(dtype), k.to(dtype), v.to(dtype), return_lse=True,
                          return_weights=True)
        assert (r.out.dtype, r.lse.dtype, r.weights.dtype) == (dtype, dtype, dtype)
        f = qkv.attention(q.to(dtype), k.to(dtype), v.to(dtype), return_lse=True,
                          return_weights=True, out_dtype="float32")
        assert torch.equal(r.lse, f.lse.to(dtype)) and torch.equal(r.weights, f.weights.to(dtype))
        layer16 = qkv.MultiHeadAttention(w.to(dtype), w.to(dtype), w.to(dtype), heads=2)
        y = layer16(x.to(dtype), return_lse=True, return_weights=True)
        assert (y.out.dtype, y.lse.dtype, y.weights.dtype) == (dtype, dtype, dtype)
    assert layer(x, return_lse=True).lse.dtype == torch.float32


def test_layer_linear_and_cache_follow_the_inputs():
    rng = np.random.default_rng(1)
    wq, wk, wv = (rng.standard_normal((8, 8)) for _ in range(3))
    x = rng.standard_normal((2, 5, 8))
    layer = qkv.MultiHeadAttention(wq, wk, wv, heads=2)
    assert type(layer(x)) is np.ndarray
    out = layer(torch.from_numpy(x))
    assert type(out) is torch.Tensor and np.array_equal(out.numpy(), layer(x))
    torch_layer = qkv.MultiHeadAttention(*(torch.from_numpy(w) for w in (wq, wk, wv)), heads=2)
    assert type(torch_layer(x)) is torch.Tensor  # torch weights: torch out, whatever x is
    r = layer(torch.from_numpy(x), return_lse=True)
    assert type(r.out) is torch.Tensor and type(r.lse) is torch.Tensor
    assert type(qkv.linear(torch.from_numpy(x), wq)) is torch.Tensor
    assert type(qkv.linear(x, wq)) is np.ndarray

    cache = qkv.KVCache(kv_heads=2, d=8)
    seq = cache.add_sequence()
    k, v = tensors((2, 6, 8), (2, 6, 8), seed=2)
    cache.append(seq, k, v)
    q = tensors((2, 1, 8), seed=3)[0]
    out = cache.attention(q, seq)
    assert type(out) is torch.Tensor
    assert np.array_equal(out.numpy(), cache.attention(q.numpy(), seq))
    r = cache.attention(q, seq, return_lse=True)
    assert type(r.out) is torch.Tensor and type(r.lse) is torch.Tensor
    assert type(cache.gather(seq)) is np.ndarray  # no tensor in: NumPy


def test_requires_grad_refused_everywhere_plain_qkv_computes():
    q, k, v = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4))
    leaf = q.clone().requires_grad_()
    one_line_refusal(lambda: qkv.attention(leaf, k, v), "q", "qkv.attention")
    one_line_refusal(lambda: qkv.attention(q, k, v, attn_mask=torch.zeros(5, 7,
                                                                          requires_grad=True)),
                     "attn_mask", "qkv.attention")
    w = torch.randn(8, 8, requires_grad=True)
    one_line_refusal(lambda: qkv.MultiHeadAttention(w, w, w, heads=2), "wq",
                     "qkv.MultiHeadAttention")
    layer = qkv.MultiHeadAttention(*(t.detach() for t in (w, w, w)), heads=2)
    x = torch.randn(5, 8, requires_grad=True)
    one_line_refusal(lambda: layer(x), "x", "qkv.MultiHeadAttention")
    one_line_refusal(lambda: qkv.linear(x, w.detach()), "x", "qkv.linear")
    one_line_refusal(lambda: qkv.explain(leaf, k, v), "q", "qkv.explain")
    cache = qkv.KVCache(kv_heads=2, d=8, dv=4)
    seq = cache.add_sequence()
    one_line_refusal(lambda: cache.append(seq, k.clone().requires_grad_(), v), "k",
                     "qkv.KVCache.append")
    assert cache.length(seq) == 0
    cache.append(seq, k, v)
    one_line_refusal(lambda: cache.attention(leaf[None], [seq]), "q", "qkv.attention_cached")
    # Inside no_grad / inference_mode no graph is built: every one of them reads the tensor.
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            assert type(qkv.attention(leaf, k, v)) is torch.Tensor
            assert type(layer(x)) is torch.Tensor
            qkv.MultiHeadAttention(w, w, w, heads=2)
            assert type(cache.attention(leaf[None], [seq])) is torch.Tensor


def test_explain_returns_numpy_for_torch_inputs():
    q, k, v = tensors((2, 5, 8), (2, 7, 8), (2, 7, 4))
    e = qkv.explain(q, k, v)
    assert type(e.weights(0)) is np.ndarray
    assert np.allclose(e.weights(0), qkv.attention(q, k, v, return_weights=True).weights[0],
                       rtol=0, atol=1e-6)

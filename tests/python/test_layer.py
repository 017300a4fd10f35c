"""qkv.MultiHeadAttention and qkv.linear against NumPy float64 written from the formulas, and
against torch.nn.MultiheadAttention through from_torch."""

import numpy as np
import pytest

import qkv
from _reference import F32_TOL, F64_TOL, close

torch = pytest.importorskip("torch")

def softmax_rows(s):
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def reference_layer(x, wq, wk, wv, wo=None, bq=None, bk=None, bv=None, bo=None, heads=1,
                    kv_heads=None, memory=None, causal=False):
    """The multi-head layer in float64 from its formulas, x [B, N, d]."""
    kv_heads = kv_heads or heads
    x = np.asarray(x, np.float64)
    m = x if memory is None else np.asarray(memory, np.float64)
    q = x @ wq + (0 if bq is None else bq)
    k = m @ wk + (0 if bk is None else bk)
    v = m @ wv + (0 if bv is None else bv)
    dk = wq.shape[1] // heads
    dv = wv.shape[1] // kv_heads
    nq, nk = x.shape[-2], m.shape[-2]
    outs, weights = [], []
    for h in range(heads):
        g = h // (heads // kv_heads)
        qh = q[..., h * dk:(h + 1) * dk]
        kh = k[..., g * dk:(g + 1) * dk]
        vh = v[..., g * dv:(g + 1) * dv]
        s = qh @ np.swapaxes(kh, -1, -2) / np.sqrt(dk)
        if causal:
            allowed = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq
            s = np.where(allowed, s, -np.inf)
        w = softmax_rows(s)
        weights.append(w)
        outs.append(w @ vh)
    concat = np.concatenate(outs, axis=-1)
    out = concat if wo is None else concat @ wo + (0 if bo is None else bo)
    return out, np.stack(weights, axis=-3)


def random_weights(rng, d, heads, dk, dv, kv_heads=None, d_m=None, d_out=None, biases=True,
                   out_proj=True):
    kv_heads = kv_heads or heads
    d_m = d_m or d
    d_out = d_out or d
    w = dict(wq=rng.standard_normal((d, heads * dk)), wk=rng.standard_normal((d_m, kv_heads * dk)),
             wv=rng.standard_normal((d_m, kv_heads * dv)))
    if out_proj:
        w["wo"] = rng.standard_normal((heads * dv, d_out))
    if biases:
        w["bq"] = rng.standard_normal(heads * dk)
        w["bk"] = rng.standard_normal(kv_heads * dk)
        w["bv"] = rng.standard_normal(kv_heads * dv)
        if out_proj:
            w["bo"] = rng.standard_normal(d_out)
    return {name: value * 0.3 for name, value in w.items()}


@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("out_proj", [False, True])
def test_layer_matches_formulas_float64(biases, out_proj):
    rng = np.random.default_rng(1)
    w = random_weights(rng, d=12, heads=3, dk=4, dv=5, biases=biases, out_proj=out_proj)
    x = rng.standard_normal((2, 7, 12))
    layer = qkv.MultiHeadAttention(**w, heads=3)
    result = layer(x, return_weights=True, return_lse=True)
    out, weights = reference_layer(x, **w, heads=3)
    assert result.out.dtype == np.float64
    assert result.out.shape == out.shape
    close(result.out, out, F64_TOL)
    close(result.weights, weights, F64_TOL)
    assert result.lse.shape == (2, 3, 7)


def test_layer_float32_and_causal():
    rng = np.random.default_rng(2)
    w = random_weights(rng, d=16, heads=4, dk=4, dv=4)
    x = rng.standard_normal((3, 9, 16))
    layer = qkv.MultiHeadAttention(**{k: v.astype(np.float32) for k, v in w.items()}, heads=4)
    out = layer(x.astype(np.float32), is_causal=True)
    assert out.dtype == np.float32
    f32 = {k: v.astype(np.float32).astype(np.float64) for k, v in w.items()}
    reference, _ = reference_layer(x.astype(np.float32), **f32, heads=4, causal=True)
    close(out, reference, F32_TOL)


def test_grouped_query_and_cross_attention():
    rng = np.random.default_rng(3)
    w = random_weights(rng, d=8, heads=4, dk=3, dv=2, kv_heads=2, d_m=5, d_out=6)
    x = rng.standard_normal((2, 4, 8))
    memory = rng.standard_normal((2, 6, 5))
    layer = qkv.MultiHeadAttention(**w, heads=4, kv_heads=2)
    result = layer(x, memory, return_weights=True)
    out, weights = reference_layer(x, **w, heads=4, kv_heads=2, memory=memory)
    close(result.out, out, F64_TOL)
    close(result.weights, weights, F64_TOL)
    assert result.weights.shape == (2, 4, 4, 6)


def test_unbatched_input_and_float16_output():
    rng = np.random.default_rng(4)
    w = random_weights(rng, d=6, heads=2, dk=3, dv=3)
    x = rng.standard_normal((5, 6))
    layer = qkv.MultiHeadAttention(**w, heads=2)
    out = layer(x, out_dtype="float16")
    assert out.dtype == np.float16 and out.shape == (5, 6)
    reference, _ = reference_layer(x[None], **w, heads=2)
    # float16 keeps 11 significant bits: half an ulp is 2^-11 of the value.
    close(out, reference[0], 2.0 ** -10)


def test_bfloat16_storage_of_heads():
    rng = np.random.default_rng(5)
    w = random_weights(rng, d=8, heads=2, dk=4, dv=4)
    x = rng.standard_normal((1, 6, 8))
    layer = qkv.MultiHeadAttention(**{k: v.astype(np.float32) for k, v in w.items()}, heads=2)
    exact = layer(x.astype(np.float32))
    bf16 = layer(x.astype(np.float32), dtype="bfloat16")
    assert bf16.dtype == np.float32
    # bfloat16 keeps 8 significant bits: Q, K, V and the weights P each rounded once (2^-9
    # relative each), through a softmax and two products; a few percent of the scale bounds it.
    close(bf16, exact, 0.05)
    assert not np.array_equal(bf16, exact)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
def test_from_torch_matches_torch(bias, batch_first):
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(16, 4, bias=bias, batch_first=batch_first).double()
    # Training mode with dropout 0 computes what eval mode does, but keeps torch 1.13 off its
    # fast path, which fails on bias=False (qkv_bias None).
    module.train()
    layer = qkv.MultiHeadAttention.from_torch(module)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch_in = x if batch_first else x.transpose(0, 1)
    with torch.no_grad():
        expected, expected_weights = module(torch_in, torch_in, torch_in, need_weights=True,
                                            average_attn_weights=False)
    if not batch_first:
        expected = expected.transpose(0, 1)
    result = layer(x, return_weights=True)
    close(result.out, expected.numpy(), F64_TOL)
    close(result.weights, expected_weights.numpy(), F64_TOL)


def test_from_torch_kdim_vdim_cross_attention():
    torch.manual_seed(1)
    module = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=5, batch_first=True).double()
    module.eval()
    layer = qkv.MultiHeadAttention.from_torch(module)
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    m = torch.randn(3, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        expected, _ = module(x, m, m)
    close(layer(x, m), expected.numpy(), F64_TOL)


def test_from_torch_float32_torch_tensors_in():
    torch.manual_seed(2)
    module = torch.nn.MultiheadAttention(12, 3, batch_first=True).eval()
    layer = qkv.MultiHeadAttention.from_torch(module)
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        expected, _ = module(x, x, x)
    out = layer(x)
    assert out.dtype == torch.float32  # torch in, torch out
    with torch.no_grad():
        reference, _ = module.double()(x.double(), x.double(), x.double())
    close(out.numpy(), reference.numpy(), F32_TOL)
    # torch's own float32 answer agrees with the same reference at the same tolerance.
    close(expected.numpy(), reference.numpy(), 1e-5)


def test_from_torch_refuses_what_qkv_lacks():
    with pytest.raises(qkv.Error, match="bias_k"):
        qkv.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(qkv.Error, match="add_zero_attn"):
        qkv.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(qkv.Error, match="kdim"):
        qkv.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=3, vdim=4))


def test_linear():
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    close(qkv.linear(x, w, b), x @ w + b, F64_TOL)
    close(qkv.linear(x, w), x @ w, F64_TOL)
    out32 = qkv.linear(x.astype(np.float32), w.astype(np.float32))
    assert out32.dtype == np.float32
    close(out32, x.astype(np.float32).astype(np.float64) @ w.astype(np.float32), F32_TOL)
    with pytest.raises(qkv.Error, match="^w"):
        qkv.linear(x, w.T)


def test_zero_rows_and_zero_batch():
    rng = np.random.default_rng(7)
    w = random_weights(rng, d=4, heads=2, dk=2, dv=2)
    layer = qkv.MultiHeadAttention(**w, heads=2)
    assert layer(np.zeros((0, 4))).shape == (0, 4)
    assert layer(np.zeros((0, 3, 4))).shape == (0, 3, 4)
    result = layer(np.zeros((2, 0, 4)), return_weights=True)
    assert result.out.shape == (2, 0, 4) and result.weights.shape == (2, 2, 0, 0)
    assert qkv.linear(np.zeros((0, 4)), np.ones((4, 0))).shape == (0, 0)


def test_construction_checks_the_weights():
    rng = np.random.default_rng(8)
    w = random_weights(rng, d=6, heads=2, dk=3, dv=3)
    with pytest.raises(qkv.Error, match="wq: 6 columns do not split into 4 heads"):
        qkv.MultiHeadAttention(**w, heads=4)
    bad = dict(w, wk=w["wk"][:, :5])
    with pytest.raises(qkv.Error, match="^wk"):
        qkv.MultiHeadAttention(**bad, heads=2)
    with pytest.raises(qkv.Error, match="^kv_heads: 3 kv heads do not divide"):
        qkv.MultiHeadAttention(**w, heads=2, kv_heads=3)
    with pytest.raises(qkv.Error, match="^kv_heads: must be at least 1"):
        qkv.MultiHeadAttention(**w, heads=2, kv_heads=0)
    bad = dict(w, bq=np.ones(5))
    with pytest.raises(qkv.Error, match="^bq"):
        qkv.MultiHeadAttention(**bad, heads=2)


def test_call_errors_are_one_line():
    rng = np.random.default_rng(9)
    layer = qkv.MultiHeadAttention(**random_weights(rng, d=4, heads=2, dk=2, dv=2), heads=2)
    for call, subject in [
        (lambda: layer(np.zeros((3, 5))), "wq: has 4 rows but x has width 5"),
        (lambda: layer(np.full((3, 4), np.nan)), "x"),
        (lambda: layer(np.zeros((3, 4)), threads=-1), "threads"),
        (lambda: layer(np.zeros((3, 4)), dtype="int8"), "dtype"),
        (lambda: layer(np.zeros((3, 4)), attn_mask=np.ones((2, 3, 5), bool)), "attn_mask"),
        (lambda: layer(np.zeros((3, 4)), window=3), "window"),
    ]:
        with pytest.raises(qkv.Error) as raised:
            call()
        message = str(raised.value)
        assert "\n" not in message and message.startswith(subject), message

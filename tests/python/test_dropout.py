"""Attention dropout from Python: qkv.attention / qkv.attention_backward against a NumPy
float64 statement with the mask drawn by a NumPy Philox4x32-10 written from the definition
(include/qkv/attention.h, src/core/dropout.h); qkv.torch.attention and
qkv.torch.scaled_dot_product_attention seeded from torch's generator (torch.manual_seed
reproduces a run) and their gradients against torch autograd on the same mask; the refusals.
The layer, qkv.MultiHeadAttention(..., dropout_p=, seed=, dropout_offset=), against NumPy
float64 projections and heads with that mask (head h of batch b: the mask of (b, h)), its
backward against torch autograd on the same mask, and qkv.torch.MultiheadAttention(dropout=)
in training and eval mode."""

import numpy as np
import pytest

import qkv

MASK32 = np.uint64(0xFFFFFFFF)


def philox(c0, c1, c2, c3, seed):
    """Philox4x32-10 on arrays of uint64 lanes holding 32-bit words."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = c[0] * np.uint64(0xD2511F53)
        p1 = c[2] * np.uint64(0xCD9E8D57)
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & MASK32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & MASK32
    return c


def keep_factors(b, h, nq, nk, p, seed, offset=0):
    """Z [b, h, nq, nk]: 1/(1 - p') where kept, 0 where dropped, p' = round(p·2^16)/2^16."""
    t = int(round(p * 65536))
    bi, hi, i, j = np.meshgrid(np.arange(b), np.arange(h), np.arange(nq), np.arange(nk),
                               indexing="ij")
    block, x, v = j // 64, j % 16, (j % 64) // 16
    words = philox((block * 8 + x // 2).astype(np.uint64), i.astype(np.uint64),
                   (bi * h + hi).astype(np.uint64), np.full(i.shape, offset, np.uint64), seed)
    word_index = 2 * (v // 2) + x % 2
    word = np.choose(word_index, words)
    draw = np.where(v % 2 == 0, word & np.uint64(0xFFFF), word >> np.uint64(16))
    return np.where(draw >= t, 65536.0 / (65536 - t), 0.0)


def softmax_weights(q, k, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        nq, nk = s.shape[-2:]
        allowed = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
        s = np.where(allowed, s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def inputs(b=2, h=3, nq=40, nk=130, d=16, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, h, nq, d)), rng.standard_normal((b, h, nk, d)),
            rng.standard_normal((b, h, nk, dv)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_forward_against_numpy_philox(causal, p):
    q, k, v = inputs()
    z = keep_factors(2, 3, 40, 130, p, seed=2**40 + 7, offset=5)
    w = softmax_weights(q, k, causal) * z
    for dtype in (np.float32, np.float64):
        r = qkv.attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), is_causal=causal,
                          return_weights=True, return_lse=True, dropout_p=p, seed=2**40 + 7,
                          dropout_offset=5)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        assert np.array_equal(r.weights == 0, w == 0)
        np.testing.assert_allclose(r.weights, w, atol=tol)
        np.testing.assert_allclose(r.out, w @ v, atol=10 * tol)


def test_backward_against_numpy():
    q, k, v = inputs(nq=20, nk=70, seed=1)
    p, seed = 0.3, 123
    r = qkv.attention(q, k, v, is_causal=True, return_lse=True, dropout_p=p, seed=seed)
    dout = np.random.default_rng(2).standard_normal(r.out.shape)
    g = qkv.attention_backward(q, k, v, r.out, r.lse, dout, is_causal=True, dropout_p=p,
                               seed=seed)
    z = keep_factors(2, 3, 20, 70, p, seed)
    w = softmax_weights(q, k, True)
    dv = np.swapaxes(w * z, -1, -2) @ dout
    dp = (dout @ np.swapaxes(v, -1, -2)) * z
    delta = (dout * r.out).sum(-1, keepdims=True)
    ds = w * (dp - delta) / np.sqrt(q.shape[-1])
    np.testing.assert_allclose(g.dv, dv, atol=1e-10)
    np.testing.assert_allclose(g.dq, ds @ k, atol=1e-10)
    np.testing.assert_allclose(g.dk, np.swapaxes(ds, -1, -2) @ q, atol=1e-10)
    # float32: the tiled kernels, against the same statement.
    f = [x.astype(np.float32) for x in (q, k, v)]
    r32 = qkv.attention(*f, is_causal=True, return_lse=True, dropout_p=p, seed=seed)
    g32 = qkv.attention_backward(*f, r32.out, r32.lse, dout.astype(np.float32), is_causal=True,
                                 dropout_p=p, seed=seed)
    np.testing.assert_allclose(g32.dv, dv, atol=1e-4)
    np.testing.assert_allclose(g32.dq, ds @ k, atol=1e-4)


def test_zero_is_no_dropout_and_threads_do_not_matter():
    q, k, v = (x.astype(np.float32) for x in inputs(seed=3))
    plain = qkv.attention(q, k, v, return_weights=True)
    zero = qkv.attention(q, k, v, return_weights=True, dropout_p=0.0, seed=99)
    assert np.array_equal(plain.out, zero.out) and np.array_equal(plain.weights, zero.weights)
    one = qkv.attention(q, k, v, dropout_p=0.2, seed=4, threads=1)
    for threads in (2, 3, 8):
        assert np.array_equal(one, qkv.attention(q, k, v, dropout_p=0.2, seed=4,
                                                 threads=threads))


@pytest.mark.parametrize("kwargs, message", [
    ({"dropout_p": 1.0}, r"^dropout_p: must be in \[0, 1\)"),
    ({"dropout_p": -0.1}, r"^dropout_p: must be in \[0, 1\)"),
    ({"dropout_p": float("nan")}, r"^dropout_p: must be in \[0, 1\)"),
    ({"dropout_p": "0.1"}, r"^dropout_p: must be a number"),
    ({"dropout_p": 0.1, "seed": 1.5}, r"^seed: must be an integer in \[0, 2\*\*64\), got 1\.5"),
    ({"dropout_p": 0.1, "seed": -1}, r"^seed: must be an integer"),
    ({"dropout_p": 0.1, "seed": "3"}, r"^seed: must be an integer"),
    ({"dropout_p": 0.1, "seed": True}, r"^seed: must be an integer"),
    ({"dropout_p": 0.1, "seed": 2**64}, r"^seed: must be an integer"),
    ({"dropout_p": 0.1, "dropout_offset": 2**32}, r"^dropout_offset: must be an integer"),
])
def test_bad_dropout_arguments(kwargs, message):
    q, k, v = inputs(b=1, h=1, nq=4, nk=4)
    with pytest.raises(qkv.Error, match=message) as info:
        qkv.attention(q, k, v, **kwargs)
    assert "\n" not in str(info.value)


def layer_inputs(b=2, n=33, d=12, heads=4, kv_heads=2, dk=3, dv=5, d_out=7, seed=5):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal
    return {"x": r((b, n, d)), "wq": r((d, heads * dk)), "wk": r((d, kv_heads * dk)),
            "wv": r((d, kv_heads * dv)), "wo": r((heads * dv, d_out)), "bq": r(heads * dk),
            "bv": r(kv_heads * dv), "bo": r(d_out)}


def layer_numpy(t, heads, kv_heads, z, causal, xp=np):
    """The layer from its formulas in NumPy (or torch, xp=torch, for autograd), heads as
    [B, H, N, w]; z: the keep factors [B, H, N, N]. Returns the output and the weights after
    dropout."""
    torch_ = xp is not np

    def split(y, h):  # [B, N, h·w] -> [B, h, N, w]
        return xp.swapaxes(y.reshape(y.shape[0], y.shape[1], h, -1), 1, 2)

    def bias(name):
        return t[name] if t.get(name) is not None else 0.0

    q = split(t["x"] @ t["wq"] + bias("bq"), heads)
    k = split(t["x"] @ t["wk"] + bias("bk"), kv_heads)
    v = split(t["x"] @ t["wv"] + bias("bv"), kv_heads)
    group = heads // kv_heads  # query head h reads kv head h // group
    k, v = ((y.repeat_interleave(group, 1) if torch_ else np.repeat(y, group, 1)) for y in (k, v))
    s = q @ xp.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    n = s.shape[-1]
    if causal:
        allowed = np.arange(n)[None, :] <= np.arange(n)[:, None]
        s = xp.where(xp.asarray(allowed) if torch_ else allowed, s, -np.inf)
    e = xp.exp(s - (s.amax(-1, keepdim=True) if torch_ else s.max(-1, keepdims=True)))
    w = e / (e.sum(-1, keepdim=True) if torch_ else e.sum(-1, keepdims=True))
    concat = xp.swapaxes((w * z) @ v, 1, 2).reshape(t["x"].shape[0], t["x"].shape[1], -1)
    return concat @ t["wo"] + bias("bo"), w * z


def make_layer(t, heads=4, kv_heads=2):
    return qkv.MultiHeadAttention(t["wq"], t["wk"], t["wv"], t["wo"], bq=t["bq"], bv=t["bv"],
                                  bo=t["bo"], heads=heads, kv_heads=kv_heads)


@pytest.mark.parametrize("causal", [False, True])
def test_layer_forward_against_numpy_philox(causal):
    t = layer_inputs()
    p, seed, offset = 0.3, 2**63 + 12345, 2**32 - 1
    z = keep_factors(2, 4, 33, 33, p, seed, offset)
    out, weights = layer_numpy(t, 4, 2, z, causal)
    r = make_layer(t)(t["x"], is_causal=causal, return_weights=True, dropout_p=p, seed=seed,
                      dropout_offset=offset)
    assert np.array_equal(r.weights == 0, weights == 0)
    np.testing.assert_allclose(r.weights, weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.out, out, rtol=0, atol=1e-11 * np.abs(out).max())
    # float32 inputs: the same mask, float32 rounding.
    f = make_layer({name: a.astype(np.float32) for name, a in t.items()})
    r32 = f(t["x"].astype(np.float32), is_causal=causal, return_weights=True, dropout_p=p,
            seed=seed, dropout_offset=offset)
    # (Weights below float32's exp range underflow to 0: compare the mask where it shows.)
    assert (r32.weights[z == 0] == 0).all() and (r32.weights[weights > 1e-6] != 0).all()
    np.testing.assert_allclose(r32.out, out, rtol=0, atol=1e-4 * np.abs(out).max())


def test_layer_zero_is_no_dropout_and_threads_do_not_matter():
    t = {name: a.astype(np.float32) for name, a in layer_inputs(seed=6).items()}
    layer = make_layer(t)
    plain = layer(t["x"], is_causal=True)
    assert np.array_equal(plain, layer(t["x"], is_causal=True, dropout_p=0.0, seed=5,
                                       dropout_offset=2))
    one = layer(t["x"], is_causal=True, dropout_p=0.2, seed=4, threads=1)
    assert not np.array_equal(one, plain)
    for threads in (2, 3):
        assert np.array_equal(one, layer(t["x"], is_causal=True, dropout_p=0.2, seed=4,
                                         threads=threads))


@pytest.mark.parametrize("kwargs, message", [
    ({"dropout_p": 1.0}, r"^dropout_p: must be in \[0, 1\)"),
    ({"dropout_p": -0.5}, r"^dropout_p: must be in \[0, 1\)"),
    ({"dropout_p": 0.1, "seed": -1}, r"^seed: must be an integer"),
    ({"dropout_p": 0.1, "dropout_offset": 2**32}, r"^dropout_offset: must be an integer"),
])
def test_layer_bad_dropout_arguments(kwargs, message):
    t = layer_inputs(n=4)
    with pytest.raises(qkv.Error, match=message) as info:
        make_layer(t)(t["x"], **kwargs)
    assert "\n" not in str(info.value)


torch = pytest.importorskip("torch")


def test_layer_backward_against_torch_autograd_on_the_same_mask():
    t = layer_inputs(n=21, seed=7)
    p, seed, offset = 0.4, 99, 3
    layer = make_layer(t)
    out, state = layer(t["x"], is_causal=True, dropout_p=p, seed=seed, dropout_offset=offset,
                       return_state=True)
    dy = np.random.default_rng(8).standard_normal(out.shape)
    g = layer.backward(dy, state, threads=3)
    tt = {name: torch.tensor(a, requires_grad=True) for name, a in t.items()}
    z = torch.tensor(keep_factors(2, 4, 21, 21, p, seed, offset))
    ref, _ = layer_numpy(tt, 4, 2, z, True, xp=torch)
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=0, atol=1e-12)
    ref.backward(torch.tensor(dy))
    for name, got in (("x", g.dx), ("wq", g.dwq), ("wk", g.dwk), ("wv", g.dwv), ("wo", g.dwo),
                      ("bq", g.dbq), ("bv", g.dbv), ("bo", g.dbo)):
        want = tt[name].grad.numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * max(1, np.abs(want).max()),
                                   err_msg=name)


def test_torch_multihead_attention_dropout_in_training_mode_only():
    import qkv.torch as qt
    torch.manual_seed(0)
    mha = qt.MultiheadAttention(16, 4, kv_heads=2, dropout=0.25, dtype=torch.float64)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mha.eval()
    plain = mha(x, is_causal=True)
    mha.train()
    torch.manual_seed(5)
    a = mha(x, is_causal=True)
    torch.manual_seed(5)
    b = mha(x, is_causal=True)
    assert torch.equal(a, b) and not torch.allclose(a, plain)
    # The mask is qkv's of the seed drawn from torch's generator, per head of the projections.
    torch.manual_seed(5)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    t = {"x": x, "wq": mha.wq, "wk": mha.wk, "wv": mha.wv, "wo": mha.wo, "bq": mha.bq,
         "bk": mha.bk, "bv": mha.bv, "bo": mha.bo}
    z = torch.tensor(keep_factors(2, 4, 12, 12, 0.25, seed))
    ref, _ = layer_numpy(t, 4, 2, z, True, xp=torch)
    assert torch.allclose(a, ref, atol=1e-12)
    a.sum().backward()
    params = (mha.wq, mha.wk, mha.wv, mha.wo, mha.bq, mha.bv, mha.bo)
    grads = [prm.grad.clone() for prm in params]
    for prm in mha.parameters():
        prm.grad = None
    ref.sum().backward()
    for got, prm in zip(grads, params):
        assert torch.allclose(got, prm.grad, atol=1e-10)
    # A call's dropout_p overrides the module's; bad rates are refused naming the argument.
    assert torch.equal(mha(x, is_causal=True, dropout_p=0.0), plain)
    with pytest.raises(qkv.Error, match=r"^dropout: must be a number in \[0, 1\)"):
        qt.MultiheadAttention(16, 4, dropout=1.0)



def test_torch_attention_seeded_by_torch_and_its_gradients():
    import qkv.torch as qt
    q, k, v = (torch.tensor(x, dtype=torch.float64, requires_grad=True)
               for x in inputs(nq=30, nk=90, seed=4))
    torch.manual_seed(11)
    a = qt.attention(q, k, v, is_causal=True, dropout_p=0.25)
    torch.manual_seed(11)
    b = qt.attention(q, k, v, is_causal=True, dropout_p=0.25)
    c = qt.attention(q, k, v, is_causal=True, dropout_p=0.25)  # the generator moved on
    assert torch.equal(a, b) and not torch.equal(a, c)
    # The seed qkv.torch drew: the same draw from the same generator state.
    torch.manual_seed(11)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    z = torch.tensor(keep_factors(2, 3, 30, 90, 0.25, seed))
    dout = torch.randn(a.shape, dtype=torch.float64)
    a.backward(dout)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    s = q @ k.transpose(-1, -2) / 4.0
    allowed = torch.ones(30, 90, dtype=torch.bool).tril(90 - 30)
    w = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
    ref = (w * z) @ v
    assert torch.allclose(a, ref, atol=1e-12)
    ref.backward(dout)
    for got, x in zip(grads, (q, k, v)):
        assert torch.allclose(got, x.grad, atol=1e-10)


def test_sdpa_dropout_reproducible_with_manual_seed():
    import qkv.torch as qt
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    torch.manual_seed(3)
    a = qt.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    torch.manual_seed(3)
    b = qt.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    assert torch.equal(a, b)
    assert not torch.equal(a, qt.scaled_dot_product_attention(q, q, q))
    a.sum().backward()
    assert torch.isfinite(q.grad).all()
    with pytest.raises(qkv.Error, match=r"^dropout_p: must be in \[0, 1\)"):
        qt.scaled_dot_product_attention(q, q, q, dropout_p=1.5)

"""Attention dropout from Python: qkv.attention / qkv.attention_backward against a NumPy
float64 statement with the mask drawn by a NumPy Philox4x32-10 written from the definition
(include/qkv/attention.h, src/core/dropout.h); qkv.torch.attention and
qkv.torch.scaled_dot_product_attention seeded from torch's generator (torch.manual_seed
reproduces a run) and their gradients against torch autograd on the same mask; the refusals."""

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


torch = pytest.importorskip("torch")


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

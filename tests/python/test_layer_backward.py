"""qkv.MultiHeadAttention.backward: the layer's gradients against central finite differences of
the layer itself in float64, against torch autograd through the same formulas, bitwise the same
for 1, 2 and 3 threads, and its refusals."""

import numpy as np
import pytest

import qkv
from test_layer import random_weights

WEIGHTS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")


def loss(layer, x, memory, grad_out, **options):
    return float(np.sum(layer(x, memory, **options) * grad_out))


def finite_difference(f, array, eps=1e-6):
    """d f / d array by central differences, one element at a time (array changed in place and
    restored)."""
    grad = np.zeros_like(array)
    flat, out = array.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        kept = flat[i]
        flat[i] = kept + eps
        up = f()
        flat[i] = kept - eps
        down = f()
        flat[i] = kept
        out[i] = (up - down) / (2 * eps)
    return grad


def assert_close(computed, expected, what):
    scale = max(1.0, float(np.max(np.abs(expected))))
    error = float(np.max(np.abs(computed - expected))) / scale
    assert error < 1e-6, f"{what}: relative error {error:.2e}"


CASES = {
    "causal_gqa_biases": dict(layer=dict(d=5, heads=4, dk=3, dv=2, kv_heads=2, d_out=4),
                              options=dict(is_causal=True), memory=False),
    "cross_attention_no_out_proj": dict(
        layer=dict(d=4, heads=2, dk=3, dv=3, d_m=6, biases=False, out_proj=False),
        options=dict(), memory=True),
    "softcap_window_sinks_alibi": dict(layer=dict(d=6, heads=2, dk=4, dv=3, d_out=5),
                                       options=dict(softcap=2.0, window=(2, 1), alibi_slopes=True,
                                                    sinks=np.array([0.3, -0.2])),
                                       memory=False),
    "bool_mask_unbatched": dict(layer=dict(d=4, heads=2, dk=2, dv=2),
                                options=dict(attn_mask="bool"), memory=False, unbatched=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_finite_differences_in_float64(name):
    case = CASES[name]
    rng = np.random.default_rng(7)
    w = random_weights(rng, **case["layer"])
    heads, kv_heads = case["layer"]["heads"], case["layer"].get("kv_heads")
    layer = qkv.MultiHeadAttention(**w, heads=heads, kv_heads=kv_heads)
    shape = (5, case["layer"]["d"]) if case.get("unbatched") else (2, 5, case["layer"]["d"])
    x = rng.standard_normal(shape)
    memory = (rng.standard_normal((2, 6, case["layer"]["d_m"])) if case["memory"] else None)
    options = dict(case["options"])
    if options.get("attn_mask") == "bool":
        mask = rng.random((heads, 5, 5)) < 0.7
        mask[:, :, 0] = True  # every row keeps a key
        options["attn_mask"] = mask
    out, state = layer(x, memory, return_state=True, **options)
    assert np.array_equal(out, layer(x, memory, **options))  # the state changes no bit
    grad_out = rng.standard_normal(out.shape)
    g = layer.backward(grad_out, state)
    assert isinstance(g, qkv.LayerGradients)

    def f():
        return loss(layer, x, memory, grad_out, **options)

    assert g.dx.dtype == np.float64 and g.dx.shape == x.shape
    assert_close(g.dx, finite_difference(f, x), "dx")
    if memory is None:
        assert g.dmemory is None
    else:
        assert g.dmemory.shape == memory.shape
        assert_close(g.dmemory, finite_difference(f, memory), "dmemory")
    for n in WEIGHTS:
        given = w.get(n)
        computed = getattr(g, "d" + n)
        if given is None:
            assert computed is None, n
            continue
        assert computed.shape == given.shape, n
        # The layer holds the array given, without a copy: a change to it is a change to W.
        assert_close(computed, finite_difference(f, getattr(layer, n)), "d" + n)
    if "sinks" in options:
        assert_close(g.dsinks, finite_difference(f, options["sinks"]), "dsinks")
    else:
        assert g.dsinks is None


def test_the_state_serves_many_backwards_and_nothing_is_computed_twice():
    rng = np.random.default_rng(8)
    w = random_weights(rng, d=8, heads=2, dk=4, dv=4)
    layer = qkv.MultiHeadAttention(**w, heads=2)
    x = rng.standard_normal((3, 7, 8))
    result, state = layer(x, is_causal=True, return_lse=True, return_state=True)
    assert isinstance(result, qkv.AttentionResult) and result.lse.shape == (3, 2, 7)
    g1 = layer.backward(np.ones_like(result.out), state)
    g2 = layer.backward(2 * np.ones_like(result.out), state)
    for a, b in zip(g1, g2):
        if a is not None:
            np.testing.assert_allclose(2 * a, b, rtol=1e-12, atol=1e-12)
    assert "qkv.LayerState" in repr(state)


def test_float32_gradients_are_bitwise_the_same_for_1_2_3_threads():
    rng = np.random.default_rng(9)
    w = {n: a.astype(np.float32) for n, a in
         random_weights(rng, d=32, heads=4, dk=16, dv=8, kv_heads=2, d_out=24).items()}
    layer = qkv.MultiHeadAttention(**w, heads=4, kv_heads=2)
    x = rng.standard_normal((2, 150, 32)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        out, state = layer(x, is_causal=True, threads=threads, return_state=True)
        grad_out = np.linspace(-1, 1, out.size, dtype=np.float32).reshape(out.shape)
        g = layer.backward(grad_out, state)
        assert g.dx.dtype == np.float32 and g.dwq.dtype == np.float32
        results.append((out, g))
        # threads= of the backward overrides the forward's; the bits do not move.
        again = layer.backward(grad_out, state, threads=4 - threads)
        for a, b in zip(g, again):
            assert (a is None and b is None) or a.tobytes() == b.tobytes()
    for out, g in results[1:]:
        assert out.tobytes() == results[0][0].tobytes()
        for a, b in zip(g, results[0][1]):
            assert (a is None and b is None) or a.tobytes() == b.tobytes()


def test_every_backward_kernel_agrees():
    rng = np.random.default_rng(10)
    w = random_weights(rng, d=8, heads=2, dk=4, dv=4)
    layer = qkv.MultiHeadAttention(**w, heads=2)
    x = rng.standard_normal((2, 9, 8))
    out, state = layer(x, is_causal=True, return_state=True)
    grad_out = rng.standard_normal(out.shape)
    reference = layer.backward(grad_out, state, kernel="reference")
    for kernel in qkv.backward_kernel_names():
        g = layer.backward(grad_out, state, kernel=kernel)
        for a, b in zip(g, reference):
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10, err_msg=kernel)


def test_torch_tensors_in_give_torch_gradients_equal_to_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    w = random_weights(rng, d=6, heads=2, dk=3, dv=3, d_out=6)
    tw = {n: torch.tensor(a) for n, a in w.items()}
    layer = qkv.MultiHeadAttention(**tw, heads=2)
    x = torch.tensor(rng.standard_normal((2, 5, 6)))
    out, state = layer(x, is_causal=True, return_state=True)
    grad_out = torch.tensor(rng.standard_normal(tuple(out.shape)))
    g = layer.backward(grad_out, state)
    assert isinstance(g.dx, torch.Tensor) and g.dx.dtype == torch.float64

    # The same layer in torch: the X·W layout, heads as column blocks.
    leaves = {n: t.clone().requires_grad_(True) for n, t in tw.items()}
    xg = x.clone().requires_grad_(True)

    def split(t):  # [B, N, heads·c] -> [B, heads, N, c]
        return t.reshape(2, 5, 2, -1).transpose(1, 2)

    q = split(xg @ leaves["wq"] + leaves["bq"])
    k = split(xg @ leaves["wk"] + leaves["bk"])
    v = split(xg @ leaves["wv"] + leaves["bv"])
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = heads.transpose(1, 2).reshape(2, 5, -1) @ leaves["wo"] + leaves["bo"]
    (y * grad_out).sum().backward()
    torch.testing.assert_close(g.dx, xg.grad, rtol=1e-10, atol=1e-10)
    for n in WEIGHTS:
        torch.testing.assert_close(getattr(g, "d" + n), leaves[n].grad, rtol=1e-10, atol=1e-10)


def test_refusals_name_the_argument_in_one_line():
    rng = np.random.default_rng(12)
    w = random_weights(rng, d=4, heads=2, dk=2, dv=2)
    layer = qkv.MultiHeadAttention(**w, heads=2)
    other = qkv.MultiHeadAttention(**w, heads=2)
    x = rng.standard_normal((2, 3, 4))
    out, state = layer(x, return_state=True)
    with pytest.raises(qkv.Error, match=r"^state: .*another layer"):
        other.backward(np.ones_like(out), state)
    with pytest.raises(qkv.Error, match=r"^state: expected the qkv.LayerState"):
        layer.backward(np.ones_like(out), None)
    with pytest.raises(qkv.Error, match=r"^grad_out: shape \[2, 3, 5\] should be \[2, 3, 4\]"):
        layer.backward(np.ones((2, 3, 5)), state)
    with pytest.raises(qkv.Error, match=r"^grad_out: .*NaN"):
        layer.backward(np.full_like(out, np.nan), state)
    with pytest.raises(qkv.Error, match=r"kernel"):
        layer.backward(np.ones_like(out), state, kernel="no_such_kernel")
    _, half = layer(x, dtype="float16", return_state=True)
    with pytest.raises(qkv.Error) as refused:
        layer.backward(np.ones_like(out), half)
    assert "\n" not in str(refused.value)
    # A bfloat16 attention has a backward: the layer's gradients stay in its float32.
    _, brain = layer(x, dtype="bfloat16", return_state=True)
    grads = layer.backward(np.ones_like(out), brain)
    exact = layer.backward(np.ones_like(out), state)
    for got, want in zip(grads, exact):
        if want is None:
            continue
        assert got.dtype == want.dtype
        assert np.abs(got - want).max() <= 3e-2 * max(1.0, np.abs(want).max())

"""qkv.explain, MultiHeadAttention.explain and qkv.Explanation: the walk-through agrees with
qkv.attention, the text and the page are what `qkv explain` makes."""

import html
import os

import numpy as np
import pytest

import qkv
from _reference import close as check_close

# Everything here is float64: explain recomputes from float64 copies, so the walk-through and
# qkv.attention's float64 path agree to rounding.
TOL = 1e-12


def close(actual, reference, tol=TOL):
    check_close(actual, reference, tol)


def inputs(seed=0, heads=2, kv_heads=2, nq=5, nk=6, d=4, dv=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((heads, nq, d)), rng.standard_normal((kv_heads, nk, d)),
            rng.standard_normal((kv_heads, nk, dv)))


def test_walk_through_equals_attention():
    q, k, v = inputs(heads=4, kv_heads=2)
    expected = qkv.attention(q, k, v, is_causal=True, return_weights=True, return_lse=True)
    e = qkv.explain(q, k, v, is_causal=True)
    assert (e.heads, e.nq, e.nk, e.parts) == (4, 5, 6, 1)
    for head in range(4):
        close(e.weights(head), expected.weights[head])
        for row in range(5):
            step = e.walk_through(head, row)
            close(step["weight"], expected.weights[head, row])
            close(step["out"], expected.out[head, row])
            close(step["weighted_sum"], expected.out[head, row])
            close(step["lse"], expected.lse[head, row])
            close(step["raw"], k[head // 2] @ q[head, row])
            assert step["allowed_keys"] == row + 2  # causal, bottom-right: nk - nq = 1
            assert list(step["by_weight"][:1]) == [int(np.argmax(step["weight"]))]


def test_score_modifiers_pass_through():
    q, k, v = inputs(seed=1)
    sinks = np.array([0.5, -1.0])
    slopes = np.array([0.25, 0.125])
    options = dict(softcap=2.0, alibi_slopes=slopes, sinks=sinks, window=(2, 0), scale=0.7)
    expected = qkv.attention(q, k, v, return_weights=True, return_lse=True, **options)
    e = qkv.explain(q, k, v, **options)
    for head in range(2):
        close(e.weights(head), expected.weights[head])
        step = e.walk_through(head, 3)
        close(step["capped"], 2.0 * np.tanh(0.7 * step["raw"] / 2.0))
        close(step["alibi"], -slopes[head] * np.abs(3 + 1 - np.arange(6)))
        close(step["sink_share"], np.exp(sinks[head] - expected.lse[head, 3]))
        close(step["weight"].sum() + step["sink_share"], 1.0)
    assert "softcap" in e.text()


def test_text_is_the_walk_through():
    q, k, v = inputs(seed=2)
    e = qkv.explain(q, k, v, key_labels=list("abcdef"), query_labels=list("PQRST"),
                    title="my attention")
    text = e.text(rows=[1], head=1)
    assert text.startswith("my attention\n")
    assert '── query 1 "Q", head 1 ──' in text
    assert "head 0 ──" not in text
    assert "O_1 = Σ_j w_1j·v_j" in text
    default = e.text()
    assert "── query" in default and "entropy" in default
    with pytest.raises(qkv.Error, match="^head: head 2 is outside the 2 heads"):
        e.text(head=2)
    with pytest.raises(qkv.Error, match="^rows: row 5 is outside the 5 query rows"):
        e.text(rows=[5])


def test_builtin_example():
    e = qkv.explain()
    assert e.parts == 2
    text = e.text()
    assert text.startswith("qkv explain: the built-in example")
    assert "Part 1. Cross-attention" in text and "Part 2." in text
    assert "What the example shows" in text
    assert "Alien" in text
    step = e.walk_through(0, 0)
    close(step["weighted_sum"], step["out"])
    close(step["weight"], np.exp(step["score"] - step["lse"]))
    assert e.walk_through(0, 0, part=1)["row"] == 0
    with pytest.raises(qkv.Error, match="^part: part 2 is outside the 2 parts"):
        e.walk_through(0, 0, part=2)
    with pytest.raises(qkv.Error, match="^is_causal: applies to given q, k, v"):
        qkv.explain(is_causal=True)
    with pytest.raises(qkv.Error, match="^attn_mask: applies to given q, k, v"):
        qkv.explain(attn_mask=np.ones((4, 6), bool))


def test_low_precision_storage_is_what_is_explained():
    q, k, v = (a.astype(np.float32) for a in inputs(seed=8))
    e = qkv.explain(q, k, v, dtype="bfloat16")
    assert "bfloat16" in e.text() or "bf16" in e.text()
    step = e.walk_through(0, 1)
    bits = q[0, 1].view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    assert np.array_equal(step["q"], rounded.view(np.float32))  # rounded once, nearest even
    assert not np.array_equal(step["q"], q[0, 1])
    # The kernel rounds P to bfloat16 (2^-9 relative) before P·V; the float64 weighted sum does
    # not: a percent of the scale leaves room for the float32 accumulation too.
    close(step["weighted_sum"], step["out"], 1e-2)


def test_page_and_notebook(tmp_path):
    e = qkv.explain(*inputs(seed=3))
    path = tmp_path / "page.html"
    e.save_html(path)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert page == e.html()
    e.save_html(str(path))  # replaced atomically, as str too
    assert os.listdir(tmp_path) == ["page.html"]
    frame = e._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and frame.endswith("</iframe>")
    assert "width: 100%" in frame and "height: 640px" in frame
    srcdoc = frame[len('<iframe srcdoc="'):frame.index('" style=')]
    assert '"' not in srcdoc and "<" not in srcdoc
    assert html.unescape(srcdoc) == page


def test_save_html_file_errors(tmp_path):
    e = qkv.explain(*inputs(seed=4))
    for target in (tmp_path / "missing" / "page.html", tmp_path):
        with pytest.raises(qkv.FileError) as raised:
            e.save_html(target)
        assert isinstance(raised.value, OSError) and isinstance(raised.value, qkv.Error)
        assert str(raised.value).startswith(str(target))
        assert "\n" not in str(raised.value)


def test_layer_explain_matches_the_layer():
    rng = np.random.default_rng(5)
    wq, wk, wv = (rng.standard_normal((6, 4)) for _ in range(3))
    wo = rng.standard_normal((4, 3))
    x = rng.standard_normal((2, 5, 6))
    layer = qkv.MultiHeadAttention(wq, wk, wv, wo, heads=2)
    expected = layer(x, is_causal=True, return_weights=True)
    e = layer.explain(x, is_causal=True, batch=1)
    for head in range(2):
        close(e.weights(head), expected.weights[1, head])
    step = e.walk_through(1, 4)
    close(step["x"], x[1, 4])
    close(step["q"], (x[1, 4] @ wq)[2:4])
    text = e.text(rows=[4])
    assert "layer output for query 4 = concat_h O_i·W^O" in text
    assert "k_j = m_j·W^K" in text
    with pytest.raises(qkv.Error, match="^batch"):
        layer.explain(x, batch=2)


def test_cross_attention_layer_explain():
    rng = np.random.default_rng(6)
    layer = qkv.MultiHeadAttention(rng.standard_normal((3, 2)), rng.standard_normal((4, 2)),
                                   rng.standard_normal((4, 2)), heads=1)
    x, m = rng.standard_normal((3, 3)), rng.standard_normal((5, 4))
    expected = layer(x, m, return_weights=True)
    e = layer.explain(x, m)
    close(e.weights(0), expected.weights[0])
    assert "cross-attention" in e.text()


def test_zero_rows_and_keys():
    for nq, nk in [(0, 3), (3, 0), (0, 0)]:
        e = qkv.explain(np.zeros((nq, 4)), np.zeros((nk, 4)), np.zeros((nk, 2)))
        assert e.weights(0).shape == (nq, nk)
        assert e.html().startswith("<!DOCTYPE html>")
        if nq:
            step = e.walk_through(0, 0)
            assert step["lse"] == -np.inf and step["allowed_keys"] == 0
            assert np.array_equal(step["out"], [0.0, 0.0])


def test_errors_are_one_line():
    q, k, v = inputs(seed=7)
    e = qkv.explain(q, k, v)
    for call, start in [
        (lambda: qkv.explain(q, k), "v: is needed"),
        (lambda: qkv.explain(q, k[:, :, :3], v), "k"),
        (lambda: qkv.explain(q, k, v, key_labels=["a"]), "key_labels"),
        (lambda: qkv.explain(q, k, v, query_labels="PQRST"), "query_labels"),
        (lambda: qkv.explain(q, k, v, batch=-1), "batch"),
        (lambda: e.walk_through(2, 0), "head: head 2 is outside"),
        (lambda: e.walk_through(0, 5), "row: row 5 is outside the 5 query rows"),
        (lambda: e.weights(-1), "head"),
    ]:
        with pytest.raises(qkv.Error) as raised:
            call()
        assert str(raised.value).startswith(start) and "\n" not in str(raised.value)


def test_weights_refused_when_too_many():
    e = qkv.explain(np.ones((4097, 1)), np.ones((4097, 1)), np.ones((4097, 1)))
    with pytest.raises(qkv.Error, match="^weights: 4097 x 4097 weights are more than"):
        e.weights(0)
    step = e.walk_through(0, 4096)  # one row is still fine
    close(step["weight"], np.full(4097, 1 / 4097))


def test_builtin_text_is_what_the_cli_prints():
    import pathlib
    import subprocess

    cli = pathlib.Path(qkv.__file__).resolve().parents[2] / "qkv"  # build/qkv beside build/python
    if not cli.is_file():
        pytest.skip(f"the qkv command is not built at {cli}")
    printed = subprocess.run([str(cli), "explain"], check=True, capture_output=True).stdout
    assert qkv.explain().text() == printed.decode("utf-8")


def test_text_refuses_a_negative_head():
    q, k, v = inputs()
    e = qkv.explain(q, k, v)
    with pytest.raises(qkv.Error, match="^head: must be 0 or more"):
        e.text(head=-2)

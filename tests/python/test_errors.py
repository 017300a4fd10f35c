"""Bad inputs raise qkv.Error (a ValueError) whose one-line message starts with the argument's
name ("subject: problem"); never a crash, and no NaN where the answer is defined."""

import numpy as np
import pytest

import qkv

rng = np.random.default_rng(0)
Q = rng.standard_normal((2, 5, 8)).astype(np.float32)
K = rng.standard_normal((2, 7, 8)).astype(np.float32)
V = rng.standard_normal((2, 7, 4)).astype(np.float32)


def with_nan(a, where=(0, 1, 2)):
    a = a.copy()
    a[where] = np.nan
    return a


CU_BAD = np.array([0, 4, 2, 5], dtype=np.int32)

# (id, arguments, keywords, subject, words the problem must contain)
CASES = [
    ("q_rank_1", (Q[0, 0], K, V), {}, "q", "dims"),
    ("q_rank_5", (Q[None, None], K, V), {}, "q", "dims"),
    ("k_rank", (Q, K[0], V), {}, "k", "dims"),
    ("v_rows", (Q, K, V[:, :6]), {}, "v", "rows"),
    ("k_head_dim", (Q, K[..., :7], V), {}, "k", "head dimension"),
    ("heads_not_divisible", (np.zeros((3, 5, 8), np.float32), K, V), {}, "k", "divide"),
    ("batch_mismatch", (Q[None], np.stack([K, K]), np.stack([V, V])), {}, "k", "batch"),
    ("q_string", ("abc", K, V), {}, "q", "dtype"),
    ("k_none", (Q, None, V), {}, "k", "expected an array"),
    ("v_object", (Q, K, object()), {}, "v", "dtype"),
    ("q_int", (np.ones((2, 5, 8), np.int32), K, V), {}, "q", "dtype"),
    ("q_complex", (Q.astype(np.complex64), K, V), {}, "q", "dtype"),
    ("q_nan", (with_nan(Q), K, V), {}, "q", "NaN"),
    ("v_inf", (Q, K, with_nan(V) * 0 + np.inf), {}, "v", "infinity"),
    ("mask_shape", (Q, K, V), {"attn_mask": np.ones((3, 7), bool)}, "attn_mask", "broadcast"),
    ("mask_nan", (Q, K, V), {"attn_mask": np.full((5, 7), np.nan, np.float32)}, "attn_mask",
     "NaN"),
    ("mask_int", (Q, K, V), {"attn_mask": np.ones((5, 7), np.int64)}, "attn_mask", "dtype"),
    ("window_negative", (Q, K, V), {"window": (-2, 0)}, "window", ">= 0"),
    ("window_not_pair", (Q, K, V), {"window": 3}, "window", "(left, right)"),
    ("threads_negative", (Q, K, V), {"threads": -1}, "threads", "0"),
    ("dtype_unknown", (Q, K, V), {"dtype": "float8"}, "dtype", "float8"),
    ("out_dtype_bf16", (Q, K, V), {"out_dtype": "bfloat16"}, "out_dtype", ""),
    ("scale_nan", (Q, K, V), {"scale": float("nan")}, "scale", "finite"),
    ("scale_inf", (Q, K, V), {"scale": float("inf")}, "scale", "finite"),
    ("softcap_zero", (Q, K, V), {"softcap": 0.0}, "softcap", "> 0"),
    ("softcap_negative", (Q, K, V), {"softcap": -1.0}, "softcap", "> 0"),
    ("sinks_shape", (Q, K, V), {"sinks": np.zeros(3, np.float32)}, "sinks", "shape"),
    ("sinks_nan", (Q, K, V), {"sinks": np.array([0, np.nan], np.float32)}, "sinks", "NaN"),
    ("alibi_shape", (Q, K, V), {"alibi_slopes": np.ones(5, np.float32)}, "alibi_slopes",
     "shape"),
    ("cu_non_monotonic", (Q, K, V), {"cu_seqlens_q": CU_BAD,
                                     "cu_seqlens_k": np.array([0, 2, 4, 7], np.int32)},
     "cu_seqlens_q", "non-decreasing"),
    ("cu_one_only", (Q, K, V), {"cu_seqlens_q": np.array([0, 5], np.int32)}, "cu_seqlens_k",
     ""),
    ("cu_float", (Q, K, V), {"cu_seqlens_q": np.array([0., 5.], np.float32),
                             "cu_seqlens_k": np.array([0, 7], np.int32)}, "cu_seqlens_q",
     "int"),
    ("cu_wrong_end", (Q, K, V), {"cu_seqlens_q": np.array([0, 4], np.int32),
                                 "cu_seqlens_k": np.array([0, 7], np.int32)}, "cu_seqlens_q",
     "end"),
    ("cu_with_mask", (Q, K, V), {"cu_seqlens_q": np.array([0, 5], np.int32),
                                 "cu_seqlens_k": np.array([0, 7], np.int32),
                                 "attn_mask": np.ones((5, 7), bool)}, "attn_mask", "packed"),
    ("kernel_unknown", (Q, K, V), {"kernel": "no_such_kernel"}, "kernel no_such_kernel",
     "no such kernel"),
    ("max_memory", (Q, K, V), {"max_memory": 16}, "max_memory", "needs"),
    # Options of the wrong type are named like bad values, not pybind11's anonymous cast error.
    ("scale_string", (Q, K, V), {"scale": "abc"}, "scale", "expected a number"),
    ("softcap_string", (Q, K, V), {"softcap": "x"}, "softcap", "expected a number"),
    ("window_float", (Q, K, V), {"window": (1.5, 0)}, "window", "whole number"),
    ("threads_float", (Q, K, V), {"threads": 1.5}, "threads", "whole number"),
    ("threads_huge", (Q, K, V), {"threads": 2**70}, "threads", "whole number"),
    ("max_memory_negative", (Q, K, V), {"max_memory": -1}, "max_memory", "0 or more"),
    ("kernel_number", (Q, K, V), {"kernel": 3}, "kernel", "expected a string"),
]


@pytest.mark.parametrize("args,kwargs,subject,words", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_names_the_argument(args, kwargs, subject, words):
    with pytest.raises(qkv.Error) as info:
        qkv.attention(*args, **kwargs)
    e = info.value
    message = str(e)
    assert isinstance(e, ValueError) and not isinstance(e, qkv.FileError)
    assert "\n" not in message
    assert message.startswith(subject + ": "), message
    assert words in message, message
    if hasattr(e, "subject"):  # raised by the extension (the Python layer raises a plain one)
        assert e.subject == subject and message == f"{e.subject}: {e.problem}"


def test_defined_answers_have_no_nan():
    mask = np.zeros((5, 7), dtype=bool)  # every row fully masked
    r = qkv.attention(Q, K, V, attn_mask=mask, return_lse=True, return_weights=True)
    assert not np.isnan(r.out).any() and not np.isnan(r.weights).any()
    assert (r.out == 0).all() and (r.lse == -np.inf).all()
    huge = (Q * 1e4).astype(np.float32)  # scores of 1e8: the softmax must not overflow
    out = qkv.attention(huge, K * 1e4, V)
    assert np.isfinite(out).all()
    assert qkv.attention(Q[:, :0], K, V).shape == (2, 0, 4)


def _one_line_error(call, subject, words):
    with pytest.raises(qkv.Error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message.startswith(subject + ": "), message
    assert words in message, message


def test_a_sparse_torch_tensor_is_an_error_naming_the_argument():
    torch = pytest.importorskip("torch")
    sparse = torch.from_numpy(np.ascontiguousarray(Q)).to_sparse()
    _one_line_error(lambda: qkv.attention(sparse, K, V), "q", "sparse_coo tensor")
    _one_line_error(lambda: qkv.attention(Q, K, V, attn_mask=torch.ones(5, 7).to_sparse()),
                    "attn_mask", "to_dense")
    _one_line_error(lambda: qkv.MultiHeadAttention(torch.eye(4).to_sparse(), np.eye(4),
                                                   np.eye(4), heads=1), "wq", "sparse_coo tensor")


def test_text_with_a_lone_surrogate_is_an_error_naming_the_argument():
    q, k, v = np.ones((2, 4)), np.ones((3, 4)), np.ones((3, 2))
    _one_line_error(lambda: qkv.explain(q, k, v, query_labels=["a", "\udc80"]),
                    "query_labels[1]", "lone surrogate")
    _one_line_error(lambda: qkv.explain(q, k, v, key_labels=["\ud800", "b", "c"]),
                    "key_labels[0]", "lone surrogate")
    _one_line_error(lambda: qkv.explain(q, k, v, title="film\udcff"), "title", "lone surrogate")
    _one_line_error(lambda: qkv.KVCache(kv_heads=1, d=4, storage="\udc80"), "storage",
                    "lone surrogate")


def test_a_float16_output_past_its_range_is_refused_not_made_infinite():
    """out_dtype="float16" with an output of 1e5 (V of 1e5): refused naming out_dtype; it was
    returned as infinity."""
    q = np.ones((3, 4), np.float32)
    v = np.full((3, 2), 1e5, np.float32)
    with pytest.raises(qkv.Error, match="^out_dtype: float16 cannot hold the output's value"):
        qkv.attention(q, q, v, out_dtype="float16")
    assert qkv.attention(q, q, v / 10, out_dtype="float16").dtype == np.float16

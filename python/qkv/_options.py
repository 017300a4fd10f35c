"""The attention options every surface shares (qkv.attention, the layer, explain, the KV cache,
qkv.bench), in the one dict form their C++ bindings read (python/src/options.h)."""

from . import _qkv
from ._arrays import as_input, dtype_name


def window_bounds(window):
    """(left, right) with -1 for an unbounded side, or None without a window."""
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise _qkv.Error(f"window: expected (left, right), got {window!r}") from None
    return (-1 if left is None else left), (-1 if right is None else right)


def attention_options(attn_mask=None, is_causal=False, scale=None, window=None, softcap=None,
                      alibi_slopes=None, sinks=None, dtype=None, out_dtype=None,
                      return_lse=False, return_weights=False, threads=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, kernel=None, max_memory=None, *, caller="qkv"):
    """`caller` names the public function, for the message that refuses a tensor that requires
    grad (python/qkv/_arrays.py)."""
    alibi = alibi_slopes is True
    return {
        "cu_seqlens_q": as_input(cu_seqlens_q, "cu_seqlens_q", caller),
        "cu_seqlens_k": as_input(cu_seqlens_k, "cu_seqlens_k", caller),
        "kernel": kernel,
        "max_memory": max_memory,
        "attn_mask": as_input(attn_mask, "attn_mask", caller),
        "is_causal": bool(is_causal),
        "scale": scale,
        "window": window_bounds(window),
        "softcap": softcap,
        "alibi": alibi,
        "alibi_slopes": (None if alibi or alibi_slopes is False
                         else as_input(alibi_slopes, "alibi_slopes", caller)),
        "sinks": as_input(sinks, "sinks", caller),
        "dtype": dtype_name(dtype),
        "out_dtype": dtype_name(out_dtype),
        "return_lse": bool(return_lse),
        "return_weights": bool(return_weights),
        "threads": threads,
    }

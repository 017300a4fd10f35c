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


def _whole_number(value, name, bits):
    """value as an int in [0, 2**bits), or qkv.Error naming it (True, 1.5 and "3" are not)."""
    import numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _qkv.Error(f"{name}: must be an integer in [0, 2**{bits}), got {value!r}")
    value = int(value)
    if not 0 <= value < 2 ** bits:
        raise _qkv.Error(f"{name}: must be an integer in [0, 2**{bits}), got {value}")
    return value


def dropout_options(dropout_p=0.0, seed=0, dropout_offset=0):
    """The dropout keys of the options dict, checked: dropout_p a number in [0, 1), seed an
    integer in [0, 2**64), dropout_offset one in [0, 2**32)."""
    import numbers
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise _qkv.Error(f"dropout_p: must be a number in [0, 1), got {dropout_p!r}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise _qkv.Error(f"dropout_p: must be in [0, 1), got {dropout_p!r}")
    return {"dropout_p": dropout_p, "seed": _whole_number(seed, "seed", 64),
            "dropout_offset": _whole_number(dropout_offset, "dropout_offset", 32)}


def attention_options(attn_mask=None, is_causal=False, scale=None, window=None, softcap=None,
                      alibi_slopes=None, sinks=None, dtype=None, out_dtype=None,
                      return_lse=False, return_weights=False, threads=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, kernel=None, max_memory=None, *, caller="qkv",
                      dropout_p=0.0, seed=0, dropout_offset=0):
    """`caller` names the public function, for the message that refuses a tensor that requires
    grad (python/qkv/_arrays.py)."""
    alibi = alibi_slopes is True
    return {
        **dropout_options(dropout_p, seed, dropout_offset),
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

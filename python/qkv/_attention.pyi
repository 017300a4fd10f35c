# Type stubs of qkv.attention and qkv.attention_backward (python/qkv/_attention.py).
from typing import Literal, NamedTuple, Optional, overload

from ._types import AlibiIn, Array, ArrayIn, DTypeIn, Window

class AttentionResult(NamedTuple):
    """What qkv.attention returns when an extra output is asked for: out [..., Nq, Dv], lse
    [..., Nq] (None unless return_lse), weights [..., Nq, Nk] (None unless return_weights)."""

    out: Array
    lse: Optional[Array]
    weights: Optional[Array]

class AttentionGradients(NamedTuple):
    """What qkv.attention_backward returns: dq, dk, dv (each of its input's shape) and dsinks
    ([H], or None without sinks)."""

    dq: Array
    dk: Array
    dv: Array
    dsinks: Optional[Array]

@overload
def attention(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, attn_mask: Optional[ArrayIn] = None,
    is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
    softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
    sinks: Optional[ArrayIn] = None, cu_seqlens_q: Optional[ArrayIn] = None,
    cu_seqlens_k: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None,
    return_lse: Literal[False] = False, return_weights: Literal[False] = False,
    threads: Optional[int] = None, *, out_dtype: Optional[DTypeIn] = None,
    kernel: Optional[str] = None, max_memory: Optional[int] = None,
    layout: Optional[Literal["bhnd", "bnhd"]] = None,
    dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
) -> Array: ...
@overload
def attention(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, attn_mask: Optional[ArrayIn] = None,
    is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
    softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
    sinks: Optional[ArrayIn] = None, cu_seqlens_q: Optional[ArrayIn] = None,
    cu_seqlens_k: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None,
    return_lse: bool = False, return_weights: bool = False, threads: Optional[int] = None, *,
    out_dtype: Optional[DTypeIn] = None, kernel: Optional[str] = None,
    max_memory: Optional[int] = None, layout: Optional[Literal["bhnd", "bnhd"]] = None,
    dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
) -> AttentionResult: ...
def attention_backward(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, out: ArrayIn, lse: ArrayIn, grad_out: ArrayIn,
    attn_mask: Optional[ArrayIn] = None, is_causal: bool = False, scale: Optional[float] = None,
    window: Optional[Window] = None, softcap: Optional[float] = None,
    alibi_slopes: AlibiIn = None, sinks: Optional[ArrayIn] = None,
    cu_seqlens_q: Optional[ArrayIn] = None, cu_seqlens_k: Optional[ArrayIn] = None,
    dtype: Optional[DTypeIn] = None, threads: Optional[int] = None, *,
    kernel: Optional[str] = None, max_memory: Optional[int] = None,
    layout: Optional[Literal["bhnd", "bnhd"]] = None,
    dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
    grad_dtype: Optional[DTypeIn] = None,
) -> AttentionGradients: ...

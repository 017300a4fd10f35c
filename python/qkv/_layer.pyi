# Type stubs of qkv.linear, qkv.MultiHeadAttention and its backward (python/qkv/_layer.py).
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, Optional, Union, overload

from ._attention import AttentionResult
from ._explain import Explanation
from ._types import AlibiIn, Array, ArrayIn, DTypeIn, Window

__all__ = ["MultiHeadAttention", "LayerGradients", "LayerState", "linear"]

class LayerGradients(NamedTuple):
    """What MultiHeadAttention.backward returns: dx (x's shape), dmemory (None without a
    memory), each weight's gradient in its shape (None where the layer has no such weight) and
    dsinks ([heads], None without sinks)."""

    dx: Array
    dmemory: Optional[Array]
    dwq: Array
    dwk: Array
    dwv: Array
    dwo: Optional[Array]
    dbq: Optional[Array]
    dbk: Optional[Array]
    dbv: Optional[Array]
    dbo: Optional[Array]
    dsinks: Optional[Array]

class LayerState:
    """What MultiHeadAttention.__call__(..., return_state=True) keeps for backward: the
    forward's projections, heads and lse, its inputs and options."""

def linear(
    x: ArrayIn, w: ArrayIn, bias: Optional[ArrayIn] = None, threads: Optional[int] = None
) -> Array: ...

class MultiHeadAttention:
    """The multi-head attention layer in the X·W layout: W^Q [d, heads·dk], W^K
    [d_m, kv_heads·dk], W^V [d_m, kv_heads·dv], W^O [heads·dv, d_out] (the transposes of
    torch.nn.Linear weights)."""

    heads: int
    kv_heads: int
    # The weights as given (converted once, without copying); None where not given.
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    bq: Any
    bk: Any
    bv: Any
    bo: Any
    def __init__(
        self, wq: ArrayIn, wk: ArrayIn, wv: ArrayIn, wo: Optional[ArrayIn] = None,
        bq: Optional[ArrayIn] = None, bk: Optional[ArrayIn] = None,
        bv: Optional[ArrayIn] = None, bo: Optional[ArrayIn] = None, *, heads: int,
        kv_heads: Optional[int] = None,
    ) -> None: ...
    @overload
    def __call__(
        self, x: ArrayIn, memory: Optional[ArrayIn] = None, attn_mask: Optional[ArrayIn] = None,
        is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
        softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
        sinks: Optional[ArrayIn] = None, return_lse: Literal[False] = False,
        return_weights: Literal[False] = False, threads: Optional[int] = None,
        dtype: Optional[DTypeIn] = None, out_dtype: Optional[DTypeIn] = None,
        return_state: Literal[False] = False, *, dropout_p: float = 0.0, seed: int = 0,
        dropout_offset: int = 0,
    ) -> Array: ...
    @overload
    def __call__(
        self, x: ArrayIn, memory: Optional[ArrayIn] = None, attn_mask: Optional[ArrayIn] = None,
        is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
        softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
        sinks: Optional[ArrayIn] = None, return_lse: bool = False, return_weights: bool = False,
        threads: Optional[int] = None, dtype: Optional[DTypeIn] = None,
        out_dtype: Optional[DTypeIn] = None, return_state: Literal[False] = False, *,
        dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
    ) -> AttentionResult: ...
    @overload
    def __call__(
        self, x: ArrayIn, memory: Optional[ArrayIn] = None, attn_mask: Optional[ArrayIn] = None,
        is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
        softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
        sinks: Optional[ArrayIn] = None, return_lse: bool = False, return_weights: bool = False,
        threads: Optional[int] = None, dtype: Optional[DTypeIn] = None,
        out_dtype: Optional[DTypeIn] = None, return_state: bool = False, *,
        dropout_p: float = 0.0, seed: int = 0, dropout_offset: int = 0,
    ) -> tuple[Union[Array, AttentionResult], LayerState]: ...
    def backward(
        self, grad_out: ArrayIn, state: LayerState, *, threads: Optional[int] = None,
        kernel: Optional[str] = None,
    ) -> LayerGradients: ...
    def explain(
        self, x: ArrayIn, memory: Optional[ArrayIn] = None, *,
        attn_mask: Optional[ArrayIn] = None, is_causal: bool = False,
        scale: Optional[float] = None, window: Optional[Window] = None,
        softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
        sinks: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None,
        threads: Optional[int] = None, query_labels: Optional[Sequence[str]] = None,
        key_labels: Optional[Sequence[str]] = None, title: Optional[str] = None, batch: int = 0,
    ) -> Explanation: ...
    @classmethod
    def from_torch(cls, module: Any) -> "MultiHeadAttention": ...

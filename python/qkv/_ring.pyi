# Type stubs of qkv.ring_attention and its helpers (python/qkv/_ring.py; over mpi4py).
from typing import Any, Literal, Optional, overload

from ._attention import AttentionGradients, AttentionResult
from ._types import AlibiIn, Array, ArrayIn, DTypeIn, Window

__all__ = ["ring_attention", "ring_attention_backward", "ring_rows", "ring_layout",
           "mpi_available"]

_Layout = Literal["contiguous", "zigzag"]

def mpi_available() -> bool: ...
def ring_layout(is_causal: bool = False, window: Optional[Window] = None) -> _Layout: ...
def ring_rows(
    n: int, ranks: int, rank: int, layout: str = "contiguous"
) -> list[tuple[int, int]]: ...
# comm: an mpi4py communicator (mpi4py.MPI.Comm); None is COMM_WORLD.
@overload
def ring_attention(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, comm: Any = None, attn_mask: Optional[ArrayIn] = None,
    is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
    softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
    sinks: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None,
    return_lse: Literal[False] = False, threads: Optional[int] = None, *,
    layout: Optional[str] = None, out_dtype: Optional[DTypeIn] = None,
    kernel: Optional[str] = None,
) -> Array: ...
@overload
def ring_attention(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, comm: Any = None, attn_mask: Optional[ArrayIn] = None,
    is_causal: bool = False, scale: Optional[float] = None, window: Optional[Window] = None,
    softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
    sinks: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None, return_lse: bool = False,
    threads: Optional[int] = None, *, layout: Optional[str] = None,
    out_dtype: Optional[DTypeIn] = None, kernel: Optional[str] = None,
) -> AttentionResult: ...
def ring_attention_backward(
    q: ArrayIn, k: ArrayIn, v: ArrayIn, out: ArrayIn, lse: ArrayIn, grad_out: ArrayIn,
    comm: Any = None, attn_mask: Optional[ArrayIn] = None, is_causal: bool = False,
    scale: Optional[float] = None, window: Optional[Window] = None,
    softcap: Optional[float] = None, alibi_slopes: AlibiIn = None,
    sinks: Optional[ArrayIn] = None, dtype: Optional[DTypeIn] = None,
    threads: Optional[int] = None, *, layout: Optional[str] = None, kernel: Optional[str] = None,
) -> AttentionGradients: ...

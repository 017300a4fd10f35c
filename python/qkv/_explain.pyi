# Type stubs of qkv.explain and qkv.Explanation (python/qkv/_explain.py; the class is the
# extension's, python/src/explain_binding.cc).
from collections.abc import Sequence
from typing import Any, Optional

from ._qkv import Explanation as Explanation
from ._types import AlibiIn, ArrayIn, DTypeIn, Window

__all__ = ["explain", "Explanation"]

def explain(
    q: Optional[ArrayIn] = None, k: Optional[ArrayIn] = None, v: Optional[ArrayIn] = None, *,
    attn_mask: Optional[ArrayIn] = None, is_causal: bool = False, scale: Optional[float] = None,
    window: Optional[Window] = None, softcap: Optional[float] = None,
    alibi_slopes: AlibiIn = None, sinks: Optional[ArrayIn] = None,
    dtype: Optional[DTypeIn] = None, threads: Optional[int] = None,
    query_labels: Optional[Sequence[str]] = None, key_labels: Optional[Sequence[str]] = None,
    title: Optional[str] = None, batch: int = 0,
) -> Explanation: ...
def explain_layer(
    layer: Any, x: ArrayIn, memory: Optional[ArrayIn], options: dict[str, Any],
    query_labels: Optional[Sequence[str]], key_labels: Optional[Sequence[str]],
    title: Optional[str], batch: int,
) -> Explanation: ...

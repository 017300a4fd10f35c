# Type stubs of qkv.bench, qkv.BenchResult and qkv.attention_flops (python/qkv/_bench.py).
from dataclasses import dataclass
from typing import Optional

from ._types import DTypeIn

__all__ = ["bench", "BenchResult", "attention_flops"]

@dataclass(frozen=True)
class BenchResult:
    """What qkv.bench measured: the median seconds of one call (timed in C++), GFLOP/s, the
    kernel that ran, the threads asked for, the same attention in NumPy and the ratio."""

    seconds: float
    gflops: float
    kernel: str
    threads: int
    numpy_seconds: float
    speedup_vs_numpy: float
    flops: float
    times: list[float]

def attention_flops(
    n: int, d: int, heads: int, nk: Optional[int] = None, dv: Optional[int] = None,
    is_causal: bool = False, batch: int = 1,
) -> float: ...
def bench(
    n: int = 1024, d: int = 64, heads: int = 8, kv_heads: Optional[int] = None,
    nk: Optional[int] = None, dv: Optional[int] = None, is_causal: bool = False,
    dtype: DTypeIn = "float32", threads: Optional[int] = None, repeats: int = 10, seed: int = 0,
) -> BenchResult: ...

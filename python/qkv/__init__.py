"""qkv: transformer self-attention on a CPU, and a look inside it.

    import numpy as np, qkv
    out = qkv.attention(q, k, v, is_causal=True)      # NumPy arrays or torch tensors in

See docs/python.md for a walk-through. Errors are qkv.Error (a ValueError); problems with a
file are qkv.FileError, which is also an OSError.
"""

from ._qkv import Error, FileError, __version__, alibi_slopes, kernel_names
from ._attention import AttentionResult, attention

__all__ = ["Error", "FileError", "__version__", "alibi_slopes", "kernel_names", "attention",
           "AttentionResult"]

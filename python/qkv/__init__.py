"""qkv: transformer self-attention on a CPU, and a look inside it.

    import numpy as np, qkv
    out = qkv.attention(q, k, v, is_causal=True)      # NumPy in, NumPy out; torch in, torch out

See docs/python.md for a walk-through. Errors are qkv.Error (a ValueError); problems with a
file are qkv.FileError, which is also an OSError.
"""

from ._qkv import Error, FileError, __version__, alibi_slopes, backward_kernel_names, kernel_names
from ._attention import AttentionGradients, AttentionResult, attention, attention_backward
from ._layer import *  # noqa: F401,F403
from ._explain import *  # noqa: F401,F403
from ._io import *  # noqa: F401,F403
from ._kv_cache import *  # noqa: F401,F403
from ._bench import *  # noqa: F401,F403
from ._ring import *  # noqa: F401,F403
from ._threads import *  # noqa: F401,F403
from . import _layer, _explain, _io, _kv_cache, _bench, _ring, _threads

__all__ = ["Error", "FileError", "__version__", "alibi_slopes", "kernel_names", "attention",
           "AttentionResult", "attention_backward", "AttentionGradients", "backward_kernel_names"]
__all__ += _layer.__all__ + _explain.__all__ + _io.__all__ + _kv_cache.__all__ + _bench.__all__
__all__ += _ring.__all__ + _threads.__all__

# Type aliases shared by the stubs (no module of this name exists at run time).
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

# An input array: a NumPy array, a CPU torch tensor, a DLPack producer or anything with
# __array__ (qkv reads float32, float64, float16 and bfloat16 where they are).
ArrayIn = Any
Array = npt.NDArray[Any]
# A dtype: "float32", "float64", "float16", "bfloat16", or a NumPy or torch dtype.
DTypeIn = Union[str, npt.DTypeLike, Any]
# (left, right) of a sliding window; None or -1 leaves a side unbounded.
Window = tuple[Optional[int], Optional[int]]
# ALiBi slopes [H], or True for the standard slopes.
AlibiIn = Union[bool, ArrayIn, None]
Float64Array = npt.NDArray[np.float64]

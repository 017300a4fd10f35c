# Type stubs of qkv.read_npy, qkv.read_tensor, qkv.load_safetensors and qkv.write_npy
# (python/qkv/_io.py).
from collections.abc import Iterable
from os import PathLike
from typing import Optional, Union

from ._types import Array, ArrayIn, DTypeIn

__all__ = ["read_npy", "read_tensor", "load_safetensors", "write_npy"]

_Path = Union[str, bytes, PathLike[str], PathLike[bytes]]

def read_npy(path: _Path) -> Array: ...
def read_tensor(spec: _Path, rows: Optional[Iterable[tuple[int, int]]] = None) -> Array: ...
def load_safetensors(path: _Path) -> dict[str, Array]: ...
def write_npy(path: _Path, array: ArrayIn, dtype: Optional[DTypeIn] = None) -> None: ...

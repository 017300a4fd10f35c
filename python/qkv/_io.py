"""qkv.read_npy, qkv.load_safetensors and friends: files in and out.

Every problem with a file (missing, unreadable, truncated, malformed, not writable) raises
qkv.FileError — both a qkv.Error and an OSError — with the library's one-line message naming
the file. Paths may be str, bytes or os.PathLike; one holding a NUL byte raises qkv.Error.
Readers return NumPy arrays: reading a file takes no tensor whose kind the result could follow
(torch.from_numpy shares the array with torch).
"""

import operator

from . import _qkv
from ._arrays import as_input, dtype_name

__all__ = ["read_npy", "read_tensor", "load_safetensors", "write_npy"]


def read_npy(path):
    """The array of a .npy file (versions 1-3; little-endian float32, float64, float16 — kept as
    float16 — or bool; C order), read with every check qkv's command line makes. Integers,
    Fortran order, big-endian data and .npz archives are refused (see read_tensor for .npz)."""
    return _qkv.read_npy(path)


def read_tensor(spec, rows=None):
    """A tensor named the way the command line names one: "FILE.npy" (any other path is read
    as .npy), "FILE.safetensors:NAME" (tensor NAME of a safetensors file) or "FILE.npz:NAME"
    (array NAME of an np.savez archive). A bfloat16 tensor, which NumPy cannot hold, comes back
    as float32 (exactly: every bfloat16 is a float32).

    rows: a list of (first, last) pairs, ascending and disjoint: only those rows along the
    second-to-last axis, for every index of the leading axes, are read (by offsets into an .npy
    or safetensors file or an np.savez member; an np.savez_compressed member is inflated as a
    stream and only those rows kept), e.g. a rank's rows for qkv.ring_attention:
    read_tensor("q.npy", rows=qkv.ring_rows(n, size, rank, "zigzag"))."""
    if rows is None:
        return _qkv.read_tensor(spec)
    spans = []
    for pair in rows:
        try:
            first, last = pair
            spans.append((operator.index(first), operator.index(last)))
        except (TypeError, ValueError):
            raise TypeError("rows: expected (first, last) pairs of integers, got %r" % (pair,)) from None
    return _qkv.read_tensor_rows(spec, spans)


def load_safetensors(path):
    """Every tensor of a .safetensors file, as a dict name -> NumPy array (F32, F64, F16 as
    stored; BOOL as bool; BF16, which NumPy lacks, as float32, converted exactly). The whole
    header is validated first; a tensor of another dtype (integers) raises qkv.FileError
    naming it."""
    return _qkv.load_safetensors(path)


def write_npy(path, array, dtype=None):
    """Writes `array` to a .npy file atomically (a temporary file beside it, then a rename: never
    a partial file). dtype: "float32", "float64" or "float16" (default: the array's own; a
    bfloat16 torch tensor is written as float32). Problems with the destination raise
    qkv.FileError; an array qkv cannot take raises qkv.Error, as does a torch tensor that
    requires grad while autograd records (as tensor.numpy() refuses one: pass detach())."""
    _qkv.write_npy(path, as_input(array, "array", "qkv.write_npy"), dtype_name(dtype))

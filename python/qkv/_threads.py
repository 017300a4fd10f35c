"""Where qkv's threads run: its own, or an OpenMP runtime the process has loaded (torch's)."""

import os
import re

from . import _qkv

__all__ = ["use_openmp_threads", "openmp_threads_library"]


def use_openmp_threads(library):
    """Run qkv's threads on the OpenMP runtime `library`, already loaded in this process.

    `library` is a path, or a file name the dynamic loader knows ("libgomp.so.1"); None or ""
    goes back to qkv's own threads. qkv.torch calls this with torch's runtime when it is
    imported, if torch's parallel backend is OpenMP: torch's workers keep spinning for a while
    after each torch operator (libgomp's default is about 10 ms), on the very cores qkv's own
    threads would need; on torch's pool, they are the ones that take qkv's work. Results are
    the same bits either way. Process-wide. Raises qkv.Error naming the library when it is not
    loaded or is not an OpenMP runtime (qkv never loads one itself).
    """
    if library is None:
        library = ""
    if not isinstance(library, (str, os.PathLike)):
        raise _qkv.Error(f"library: expected a path or None, got {type(library).__name__}")
    _qkv.use_openmp_threads(os.fsdecode(library))


def openmp_threads_library():
    """The library qkv's threads run on (use_openmp_threads), or None for qkv's own threads."""
    return _qkv.openmp_threads_library() or None


def torch_openmp_library(torch):
    """The OpenMP runtime torch runs its operators on, as loaded in this process, or None when
    torch's parallel backend is not OpenMP (or its runtime cannot be found)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__))
    runtime = re.compile(r"lib(g|i|i5)?omp[^/]*\.so[.0-9]*$")
    loaded = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if path.startswith("/") and runtime.search(os.path.basename(path)):
                    loaded.append(path)
    except OSError:
        return None
    # torch's own copy first (the wheel bundles libgomp); else the one the process has.
    ours = [p for p in loaded if os.path.realpath(p).startswith(torch_dir + os.sep)]
    candidates = ours or loaded
    return candidates[0] if candidates else None

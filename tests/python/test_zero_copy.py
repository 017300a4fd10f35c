"""Inputs are read where they are: a call allocates far less Python-tracked memory than one
input holds beyond its output (tracemalloc sees NumPy's allocations, so a copy of an input would
show; a float32 or float64 output is NumPy's own memory, written in place, a float16 one qkv's),
outputs own their memory through their base, and inputs qkv cannot read in place (misaligned,
byte-swapped) are copied and still right."""

import gc
import tracemalloc

import numpy as np
import pytest

import qkv

H, N, D = 2, 1024, 64


def traced_peak(call):
    """Peak Python-tracked bytes allocated while `call` runs, and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, result


def inputs(dtype, layout, rng):
    """q, k, v of shape [H, N, D] in `layout`: C-contiguous, a column block of a wider matrix,
    or a transposed view of [N, H, D]."""
    def one():
        if layout == "contiguous":
            return rng.standard_normal((H, N, D)).astype(dtype)
        if layout == "column_block":
            return rng.standard_normal((H, N, 3 * D)).astype(dtype)[:, :, D:2 * D]
        return rng.standard_normal((N, H, D)).astype(dtype).transpose(1, 0, 2)
    return one(), one(), one()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("layout", ["contiguous", "column_block", "transposed"])
def test_inputs_not_copied(dtype, layout):
    rng = np.random.default_rng(0)
    q, k, v = inputs(dtype, layout, rng)
    assert (layout == "contiguous") == q.flags.c_contiguous
    one_input = H * N * D * np.dtype(dtype).itemsize
    qkv.attention(q, k, v, threads=1)  # warm-up: first-call allocations are not the point
    peak, out = traced_peak(lambda: qkv.attention(q, k, v, threads=1))
    assert peak < out.nbytes + one_input / 10, (
        f"{peak} bytes traced, one input is {one_input}, the output {out.nbytes}")
    # The same answer as from contiguous copies, bitwise.
    copies = [np.ascontiguousarray(a) for a in (q, k, v)]
    assert np.array_equal(out, qkv.attention(*copies, threads=1))
    # The output owns its memory through its base (a capsule holding qkv's tensor).
    assert out.base is not None and not out.flags.owndata
    # Laid out as the query is: heads interleaved (torch's layout for a transposed query, so
    # that transpose(1, 2).contiguous() copies nothing) or in C order.
    # (float16 outputs are qkv's own tensors, always in C order).
    interleaved = layout == "transposed" and dtype != np.float16
    stored = out.transpose(1, 0, 2) if interleaved else out
    assert stored.flags.c_contiguous and out.flags.writeable
    assert not any(np.shares_memory(out, a) for a in (q, k, v))


def test_tracemalloc_sees_a_copy():
    """The control: the measurement above would catch a copy of an input."""
    rng = np.random.default_rng(1)
    q, k, v = inputs(np.float32, "column_block", rng)
    peak, _ = traced_peak(lambda: qkv.attention(np.ascontiguousarray(q), k, v, threads=1))
    assert peak >= H * N * D * 4


def test_misaligned_and_byteswapped_inputs_are_copied_and_correct():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((H, 64, 32)).astype(np.float32) for _ in range(3))
    want = qkv.attention(q, k, v)
    raw = np.zeros(q.nbytes + 1, dtype=np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=q.size, offset=1)
    misaligned = misaligned.reshape(q.shape)
    misaligned[...] = q
    assert not misaligned.flags.aligned
    assert np.array_equal(qkv.attention(misaligned, k, v), want)
    swapped = k.astype(k.dtype.newbyteorder(">" if np.little_endian else "<"))
    assert not swapped.dtype.isnative
    peak, out = traced_peak(lambda: qkv.attention(q, swapped, v))
    assert np.array_equal(out, want)
    assert peak >= k.nbytes  # copied once, to native order
    reversed_rows = v[:, ::-1]
    assert np.array_equal(qkv.attention(q, k, reversed_rows),
                          qkv.attention(q, k, np.ascontiguousarray(reversed_rows)))


def test_output_memory_freed_with_the_array():
    import weakref
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 8)).astype(np.float32)
    for dtype in (np.float32, np.float16):  # NumPy's memory, written in place; qkv's tensor
        out = qkv.attention(q.astype(dtype), q.astype(dtype), q.astype(dtype))
        owner = out.base
        assert type(owner).__name__ == ("ndarray" if dtype == np.float32 else "PyCapsule")
        refs = [weakref.ref(out)] + ([weakref.ref(owner)] if dtype == np.float32 else [])
        del out, owner
        assert all(ref() is None for ref in refs)

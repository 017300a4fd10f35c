"""Reference counting holds over 10^5 calls: no growth of the resident memory beyond a few MiB,
the inputs' reference counts unchanged, the outputs freed with their last reference."""

import gc
import os
import sys
import weakref

import numpy as np

import qkv

PAGE = os.sysconf("SC_PAGESIZE")
CALLS = 100_000


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def one_round(q, k, v, sinks, mask, i):
    """One of four kinds of call, by i: plain, with lse and weights, with a mask and sinks, and
    one that raises."""
    kind = i % 4
    if kind == 0:
        qkv.attention(q, k, v, threads=1)
    elif kind == 1:
        r = qkv.attention(q, k, v, return_lse=True, return_weights=True, threads=1)
        assert r.out.shape == (2, 4, 8)
    elif kind == 2:
        qkv.attention(q, k, v, attn_mask=mask, sinks=sinks, is_causal=True, threads=1)
    else:
        try:
            qkv.attention(q, k, v[:, :3], threads=1)
        except qkv.Error:
            pass
        else:
            raise AssertionError("a bad call did not raise")


def test_many_calls_leak_nothing():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(3))
    sinks = np.zeros(2, dtype=np.float32)
    mask = rng.random((4, 4)) < 0.8
    arrays = (q, k, v, sinks, mask)
    counts = [sys.getrefcount(a) for a in arrays]
    for i in range(2000):  # warm-up: allocator pools, caches, first-use imports
        one_round(q, k, v, sinks, mask, i)
    gc.collect()
    before = rss_bytes()
    for i in range(CALLS):
        one_round(q, k, v, sinks, mask, i)
    gc.collect()
    grown = rss_bytes() - before
    # A leak of one 16-byte object per call would be 1.6 MB; of one output (128 bytes), 12 MB.
    assert grown < 2 * 2**20, f"RSS grew by {grown / 2**20:.2f} MiB over {CALLS} calls"
    assert [sys.getrefcount(a) for a in arrays] == counts


def test_outputs_are_freed():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 64, 32)).astype(np.float32)
    counts = sys.getrefcount(q)
    r = qkv.attention(q, q, q, return_lse=True, return_weights=True)
    refs = [weakref.ref(a) for a in r]
    base_counts = [sys.getrefcount(a.base) for a in r]
    assert all(c == base_counts[0] for c in base_counts)
    del r
    assert all(ref() is None for ref in refs)  # freed at once: no cycle, no extra reference
    assert sys.getrefcount(q) == counts
    # Memory given back: 200 calls, each with an output of 3 x 64 x 256 float32 (192 KiB)
    # and weights of 3 x 64 x 64 (48 KiB) dropped at once, would hold ~47 MiB if leaked.
    gc.collect()
    before = rss_bytes()
    for _ in range(200):
        qkv.attention(q, q, np.repeat(q, 8, axis=-1), return_weights=True)
    assert rss_bytes() - before < 4 * 2**20

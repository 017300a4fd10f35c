"""qkv.bench and qkv.attention_flops: the flops counted by hand, a timed run's fields, and bad
sizes refused before any array is made. (Speed itself is a benchmark's business, not a test's.)"""

import numpy as np
import pytest

import qkv


def test_attention_flops_by_hand():
    # Plain: 2·(d + dv) per pair and head: 2 heads · 3·5 pairs · 2·(4 + 6).
    assert qkv.attention_flops(3, 4, 2, nk=5, dv=6) == 2 * 15 * 20
    # Causal, Nq = 4 < Nk = 6 (bottom-right): rows allow 3, 4, 5, 6 keys = 18 pairs.
    assert qkv.attention_flops(4, 8, 1, nk=6, is_causal=True) == 18 * 2 * 16
    # Causal, Nq = 6 > Nk = 4: rows allow 0, 0, 1, 2, 3, 4 keys = 10 pairs.
    assert qkv.attention_flops(6, 8, 1, nk=4, is_causal=True) == 10 * 2 * 16
    assert qkv.attention_flops(4, 8, 3, is_causal=True, batch=2) == 2 * 3 * 10 * 2 * 16


def test_bench_reports_a_consistent_run():
    r = qkv.bench(n=64, d=16, heads=2, kv_heads=1, is_causal=True, repeats=3, threads=1)
    assert r.kernel in qkv.kernel_names()
    assert len(r.times) == 3 and r.seconds == np.median(r.times) and r.seconds > 0
    assert r.flops == qkv.attention_flops(64, 16, 2, is_causal=True)
    assert r.gflops == pytest.approx(r.flops / r.seconds * 1e-9, rel=1e-12)
    assert r.speedup_vs_numpy == pytest.approx(r.numpy_seconds / r.seconds, rel=1e-12)


@pytest.mark.parametrize("kwargs,subject", [
    (dict(n=0), "n"), (dict(d=0), "d"), (dict(heads=0), "heads"), (dict(nk=-1), "nk"),
    (dict(n="x"), "n"), (dict(heads=4, kv_heads=3), "kv_heads"), (dict(repeats=0), "repeats"),
    (dict(seed=-1), "seed"), (dict(n=10**6, d=10**6), "n"),
])
def test_bench_refuses_bad_sizes_naming_them(kwargs, subject):
    with pytest.raises(qkv.Error, match=f"^{subject}: "):
        qkv.bench(**kwargs)

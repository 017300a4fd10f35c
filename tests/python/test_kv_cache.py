"""qkv.KVCache and qkv.attention_cached: what is stored against what was appended, and attention
over the cache against NumPy float64 attention over the gathered rows."""

import threading

import numpy as np
import pytest

import qkv
from _reference import F32_TOL, bf16_round, close, reference

def filled(rng, storage="f32", kv_heads=2, d=8, dv=6, lengths=(7, 12), page_rows=4):
    cache = qkv.KVCache(kv_heads, d, dv, storage=storage, page_rows=page_rows)
    rows = {}
    for n in lengths:
        seq = cache.add_sequence()
        k = rng.standard_normal((kv_heads, n, d)).astype(np.float32)
        v = rng.standard_normal((kv_heads, n, dv)).astype(np.float32)
        # in two appends, the second starting inside a page
        cache.append(seq, k[:, :3], v[:, :3])
        cache.append(seq, k[:, 3:], v[:, 3:])
        rows[seq] = (k, v)
    return cache, rows


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_attention_over_gathered_rows(causal):
    rng = np.random.default_rng(0)
    cache, rows = filled(rng)
    seqs = cache.sequences()
    assert seqs == sorted(rows)
    q = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)  # H = 4 over Hkv = 2
    result = cache.attention(q, seqs, is_causal=causal, return_lse=True)
    assert result.out.shape == (2, 4, 3, 6) and result.out.dtype == np.float32
    for s, seq in enumerate(seqs):
        k, v = cache.gather(seq), cache.gather(seq, values=True)
        assert k.dtype == np.float64
        assert np.array_equal(k, rows[seq][0]) and np.array_equal(v, rows[seq][1])
        out, lse, _ = reference(q[s], k, v, causal=causal)
        close(result.out[s], out, F32_TOL)
        close(result.lse[s], lse, F32_TOL)
        single = qkv.attention_cached(q[s], cache, seq, is_causal=causal)
        np.testing.assert_array_equal(single, result.out[s])
        same = qkv.attention(q[s], k.astype(np.float32), v.astype(np.float32), is_causal=causal)
        close(same, out, F32_TOL)


def test_bf16_and_f16_storage_round_once():
    rng = np.random.default_rng(1)
    for storage, rounded in [("bf16", bf16_round),
                             ("f16", lambda a: a.astype(np.float16).astype(np.float32))]:
        cache, rows = filled(rng, storage=storage)
        assert cache.storage == storage
        q = rng.standard_normal((2, 4, 2, 8))
        out = cache.attention(q, cache.sequences(), is_causal=True)
        assert out.dtype == np.float64  # out follows q
        for s, seq in enumerate(cache.sequences()):
            k, v = rows[seq]
            assert np.array_equal(cache.gather(seq), rounded(k))
            assert np.array_equal(cache.gather(seq, values=True), rounded(v))
            expected, _, _ = reference(q[s], cache.gather(seq), cache.gather(seq, True),
                                       causal=True)
            close(out[s], expected, F32_TOL)


def test_int8_storage_within_half_a_step():
    rng = np.random.default_rng(2)
    d = 40  # blocks of 32 values: one full block and one of 8 per row
    cache, rows = filled(rng, storage="int8", kv_heads=1, d=d, dv=d, lengths=(9,))
    (seq,) = cache.sequences()
    k, v = rows[seq]
    for stored, original in ((cache.gather(seq), k), (cache.gather(seq, True), v)):
        for block in (slice(0, 32), slice(32, 40)):
            step = np.max(np.abs(original[..., block]), axis=-1, keepdims=True) / 127
            error = np.abs(stored[..., block] - original[..., block])
            assert np.all(error <= step / 2 * (1 + 1e-6))
        assert not np.array_equal(stored, original)
    q = rng.standard_normal((1, 4, d)).astype(np.float32)
    out = cache.attention(q, seq)
    expected, _, _ = reference(q, cache.gather(seq), cache.gather(seq, True))
    close(out, expected, F32_TOL)


def test_fork_shares_pages_until_written():
    rng = np.random.default_rng(3)
    cache = qkv.KVCache(1, 4, page_rows=4)
    parent = cache.add_sequence()
    k, v = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    cache.append(parent, k, v)
    assert cache.pages_in_use == 2 and cache.bytes_in_use == 2 * cache.page_bytes
    child = cache.fork(parent)
    assert cache.pages_in_use == 2 and cache.length(child) == 6 and child in cache
    cache.append(child, np.ones((1, 4)), np.ones((1, 4)))
    assert cache.pages_in_use == 3  # the shared, partly filled page copied on write
    assert cache.length(parent) == 6 and cache.length(child) == 7
    np.testing.assert_array_equal(cache.gather(parent), k.astype(np.float32)[None])
    np.testing.assert_array_equal(cache.gather(child)[0, :6], k.astype(np.float32))
    cache.remove(child)
    assert cache.sequences() == [parent] and cache.pages_in_use == 2
    cache.remove(parent)
    assert cache.sequences() == [] and cache.pages_in_use == 0 and cache.bytes_in_use == 0


def test_forget_before_and_window():
    rng = np.random.default_rng(4)
    cache = qkv.KVCache(1, 4, page_rows=4)
    seq = cache.add_sequence()
    k, v = rng.standard_normal((10, 4)), rng.standard_normal((10, 4))
    cache.append(seq, k, v)
    cache.forget_before(seq, 8)
    assert cache.first_stored_row(seq) == 8 and cache.length(seq) == 10
    assert cache.gather(seq).shape == (1, 2, 4) and cache.pages_in_use == 1
    q = rng.standard_normal((1, 1, 4))
    out = cache.attention(q, seq, is_causal=True, window=(1, 0))
    expected, _, _ = reference(q, k[None, 8:].astype(np.float32),
                               v[None, 8:].astype(np.float32))
    close(out, expected, F32_TOL)
    with pytest.raises(qkv.Error) as raised:
        cache.attention(q, seq)
    assert "\n" not in str(raised.value)


def test_capacity_leaves_the_cache_as_it_was():
    cache = qkv.KVCache(1, 4, page_rows=4, max_pages=1)
    seq = cache.add_sequence()
    with pytest.raises(qkv.Error, match="^KVCache capacity"):
        cache.append(seq, np.ones((5, 4)), np.ones((5, 4)))
    assert cache.length(seq) == 0 and cache.pages_in_use == 0
    cache.append(seq, np.ones((4, 4)), np.ones((4, 4)))
    assert cache.length(seq) == 4


def test_zero_rows_and_zero_queries():
    cache = qkv.KVCache(2, 3, 0)
    seq = cache.add_sequence()
    cache.append(seq, np.zeros((2, 0, 3)), np.zeros((2, 0, 0)))
    assert cache.length(seq) == 0 and cache.gather(seq).shape == (2, 0, 3)
    out = cache.attention(np.zeros((2, 0, 3)), seq)
    assert out.shape == (2, 0, 0)
    assert qkv.attention_cached(np.zeros((0, 2, 1, 3)), cache, []).shape == (0, 2, 1, 0)


def test_out_dtype_and_threads():
    rng = np.random.default_rng(5)
    cache, _ = filled(rng)
    q = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    one = cache.attention(q, cache.sequences(), threads=1)
    assert np.array_equal(one, cache.attention(q, cache.sequences(), threads=3))
    wide = cache.attention(q, cache.sequences(), out_dtype="float64")
    assert wide.dtype == np.float64
    assert np.array_equal(wide.astype(np.float32), one)  # the same float32 results, widened
    with pytest.raises(qkv.Error, match="^out_dtype"):
        cache.attention(q, cache.sequences(), out_dtype="float16")
    assert cache.attention(q.astype(np.float16), cache.sequences()).dtype == np.float32


def test_appends_from_threads_on_distinct_sequences():
    rng = np.random.default_rng(6)
    cache = qkv.KVCache(1, 8, page_rows=16)
    seqs = [cache.add_sequence() for _ in range(4)]
    data = {s: (rng.standard_normal((200, 8)), rng.standard_normal((200, 8))) for s in seqs}

    def work(seq):
        k, v = data[seq]
        for start in range(0, 200, 10):
            cache.append(seq, k[start:start + 10], v[start:start + 10])

    threads = [threading.Thread(target=work, args=(s,)) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in seqs:
        np.testing.assert_array_equal(cache.gather(s)[0], data[s][0].astype(np.float32))


def test_threads_sharing_one_sequence_are_serialised():
    """The C++ cache leaves calls on one sequence from two threads undefined; from Python they
    take turns: every append lands whole (rows of one append stay together, in order), and a
    reader sees a consistent prefix, never a crash."""
    rng = np.random.default_rng(7)
    cache = qkv.KVCache(1, 8, page_rows=8)
    seq = cache.add_sequence()
    chunks = {w: [np.full((5, 8), 100 * w + i, np.float32) for i in range(40)] for w in (1, 2)}
    errors = []

    def writer(w):
        for chunk in chunks[w]:
            cache.append(seq, chunk, -chunk)

    def reader():
        q = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)
        for _ in range(40):
            try:
                out = cache.attention(q, [seq])
                assert np.isfinite(out).all()
                cache.gather(seq)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in (1, 2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    k = cache.gather(seq)[0]
    assert k.shape == (400, 8)
    values = k[::5, 0]  # each append's first row; its five rows must all hold the same value
    np.testing.assert_array_equal(k.reshape(80, 5, 8), np.repeat(values, 40).reshape(80, 5, 8))
    for w in (1, 2):
        mine = values[(values >= 100 * w) & (values < 100 * (w + 1))]
        np.testing.assert_array_equal(mine, 100 * w + np.arange(40))


def test_remove_while_another_thread_appends_is_refused_not_undefined():
    cache = qkv.KVCache(1, 4, page_rows=4)
    seq = cache.add_sequence()
    rows = np.ones((3, 4), np.float32)
    failures = []

    def writer():
        for _ in range(200):
            try:
                cache.append(seq, rows, rows)
            except qkv.Error as e:
                failures.append(str(e))
                return

    t = threading.Thread(target=writer)
    t.start()
    cache.remove(seq)
    t.join()
    assert seq not in cache
    assert all("not in this cache" in f for f in failures), failures


@pytest.mark.parametrize("integer", [np.int32, np.int64])
def test_integer_rows_are_refused_never_read_as_floats(integer):
    cache = qkv.KVCache(1, 4)
    seq = cache.add_sequence()
    ints = np.array([[1, 2, 3, 2**20]], integer)
    floats = np.ones((1, 4), np.float32)
    with pytest.raises(qkv.Error, match=f"^k: dtype {np.dtype(integer).name} cannot be cached"):
        cache.append(seq, ints, floats)
    with pytest.raises(qkv.Error, match=f"^v: dtype {np.dtype(integer).name} cannot be cached"):
        cache.append(seq, floats, ints)
    assert cache.length(seq) == 0


def test_errors_name_their_subject():
    cache = qkv.KVCache(2, 4, page_rows=4)
    seq = cache.add_sequence()
    ok = np.zeros((2, 1, 4))
    for call, start in [
        (lambda: cache.length(99), "sequence 99"),
        (lambda: cache.fork(99), "sequence 99"),
        (lambda: cache.remove(99), "sequence 99"),
        (lambda: cache.append(99, ok, ok), "sequence 99"),
        (lambda: cache.gather(99), "sequence 99"),
        (lambda: cache.attention(np.zeros((1, 2, 1, 4)), [99]), "sequence 99"),
        (lambda: cache.append(seq, np.zeros((2, 1, 5)), ok), "k"),
        (lambda: cache.append(seq, ok, np.full((2, 1, 4), np.inf)), "v"),
        (lambda: cache.attention(np.zeros((3, 1, 4)), seq), "q"),
        (lambda: cache.attention(np.zeros((2, 1, 4)), seq, window=5), "window"),
        (lambda: qkv.KVCache(2, 4, storage="int4"), "storage"),
        (lambda: qkv.KVCache(0, 4), "KVCache"),
        (lambda: qkv.KVCache(1, 4, page_rows=0), "KVCache"),
        (lambda: qkv.KVCache(1, 4, max_pages=-1), "max_pages"),
        (lambda: qkv.attention_cached(ok, "cache", seq), "cache"),
    ]:
        with pytest.raises(qkv.Error) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(start) and "\n" not in message, message
    assert cache.length(seq) == 0


@pytest.mark.parametrize(
    "storage, too_big, largest, range_name",
    [
        ("f32", 1e39, np.finfo(np.float32).max, "float32"),
        ("bf16", 3.4e38, 3.3895313e38, "bfloat16"),
        ("f16", 65520.0, 65504.0, "float16"),
        ("int8", 1e39, np.finfo(np.float32).max, "float32"),
    ],
)
def test_values_the_pages_cannot_hold_are_refused_and_change_nothing(
    storage, too_big, largest, range_name
):
    # bf16 rounds 3.4e38 to infinity; it used to be stored, and every later call then failed.
    cache = qkv.KVCache(1, 4, storage=storage, page_rows=2)
    seq = cache.add_sequence()
    ok = np.full((3, 4), 0.5)
    cache.append(seq, ok, ok)
    before = cache.gather(seq, values=True)
    bad = np.full((2, 4), 0.25)
    bad[1, 2] = -too_big
    with pytest.raises(qkv.Error) as raised:
        cache.append(seq, ok[:2], bad)
    message = str(raised.value)
    assert message.startswith("v: value -") and "\n" not in message, message
    assert message.endswith(f" at [1, 2] is outside {range_name}'s range"), message
    assert cache.length(seq) == 3 and cache.pages_in_use == 2
    assert np.array_equal(cache.gather(seq, values=True), before)
    # The largest value each holds is kept finitely, and later calls work.
    edge = np.full((1, 4), 0.25)
    edge[0, 0] = largest
    cache.append(seq, edge, edge)
    out = cache.attention(np.ones((1, 1, 4), np.float32), seq)
    assert np.isfinite(out).all() and np.isfinite(cache.gather(seq, values=True)).all()

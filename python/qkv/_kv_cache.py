"""qkv.KVCache: decoding against cached keys and values."""

import numbers

from . import _qkv
from ._arrays import as_input, as_output, text, torch_given
from ._attention import AttentionResult
from ._options import attention_options

__all__ = ["KVCache", "attention_cached"]


class KVCache:
    """The keys and values of earlier tokens, for decoding: many sequences (beams, requests),
    each a list of pages of `page_rows` rows holding every kv head.

    KVCache(kv_heads, d, dv=None, storage="f32", page_rows=256, max_pages=0, max_bytes=0):
    d and dv are the key and value head dimensions (dv defaults to d); storage is "f32",
    "bf16", "f16" or "int8" (blocks of 32 values of a row with one float scale each:
    value = q·scale, q in [-127, 127]; the error of a value is at most half a step, scale/2,
    where scale = max|value in its block| / 127). max_pages and max_bytes bound the pool
    (0: unbounded); an append that would pass them raises qkv.Error and changes nothing.

    fork(seq) shares the parent's pages copy-on-write; a shared page is copied only when one of
    the sequences appends into it.

    Threads: append, attention and gather release the GIL, so calls on distinct sequences run
    concurrently from several Python threads (attention reading some sequences while others
    are appended to, say). Calls on one sequence from several threads take turns: each holds
    the sequence's lock, so an append lands whole before another call reads or writes it.
    """

    def __init__(self, kv_heads, d, dv=None, storage="f32", page_rows=256, max_pages=0,
                 max_bytes=0):
        self._cache = _qkv.KVCache(kv_heads, d, dv, text(storage, "storage"), page_rows, max_pages,
                                   max_bytes)

    def __repr__(self):
        kv_heads, d, dv = self._cache.shape()
        return (f"qkv.KVCache(kv_heads={kv_heads}, d={d}, dv={dv}, "
                f"storage={self._cache.storage()!r}, sequences={len(self.sequences())}, "
                f"pages_in_use={self.pages_in_use})")

    @property
    def kv_heads(self):
        return self._cache.shape()[0]

    @property
    def d(self):
        return self._cache.shape()[1]

    @property
    def dv(self):
        return self._cache.shape()[2]

    @property
    def storage(self):
        """"f32", "bf16", "f16" or "int8"."""
        return self._cache.storage()

    def add_sequence(self):
        """A new, empty sequence; returns its id (an int)."""
        return self._cache.add_sequence()

    def fork(self, seq):
        """A new sequence with the rows of `seq`, sharing its pages copy-on-write."""
        return self._cache.fork(seq)

    def remove(self, seq):
        """Forgets the sequence and frees its pages (those no other sequence shares)."""
        self._cache.remove(seq)

    def __contains__(self, seq):
        return self._cache.contains(seq)

    def sequences(self):
        """The ids of the sequences held, ascending."""
        return self._cache.sequences()

    def append(self, seq, k, v):
        """Appends n rows to `seq`: k [kv_heads, n, d] and v [kv_heads, n, dv] (or [n, d] and
        [n, dv] when kv_heads is 1); float32, float64, float16 or bfloat16, every value finite
        (and within float16's range for an "f16" cache). On any error (qkv.Error naming k, v,
        the sequence or the capacity) the cache is left exactly as it was. Torch tensors go in as
        they are; one that requires grad raises qkv.Error unless under torch.no_grad() (the
        cache keeps values, not a graph)."""
        caller = "qkv.KVCache.append"
        self._cache.append(seq, as_input(k, "k", caller), as_input(v, "v", caller))

    def forget_before(self, seq, row):
        """Frees the pages holding only rows before `row` (a sliding window's past); attention
        refuses a call that would attend a forgotten row."""
        self._cache.forget_before(seq, row)

    def length(self, seq):
        """Rows appended to `seq` so far (forgotten rows included)."""
        return self._cache.length(seq)

    def first_stored_row(self, seq):
        """The first row still stored (rows before it were forgotten)."""
        return self._cache.first_stored_row(seq)

    @property
    def pages_in_use(self):
        return self._cache.pages_in_use()

    @property
    def page_bytes(self):
        """The memory of one page."""
        return self._cache.page_bytes()

    @property
    def bytes_in_use(self):
        return self._cache.bytes_in_use()

    def gather(self, seq, values=False):
        """The stored rows [first_stored_row, length) of K (values=False) or V, dequantised
        exactly into float64: [kv_heads, rows, d or dv]. What attention reads. A NumPy array
        (no tensor comes in here to follow; torch.from_numpy shares it)."""
        return self._cache.gather(seq, bool(values))

    def attention(self, q, sequences, is_causal=False, scale=None, window=None,
                  return_lse=False, threads=None, out_dtype=None):
        """attention_cached(q, self, sequences, ...): see qkv.attention_cached."""
        return attention_cached(q, self, sequences, is_causal, scale, window, return_lse,
                                threads, out_dtype)


def attention_cached(q, cache, sequences, is_causal=False, scale=None, window=None,
                     return_lse=False, threads=None, out_dtype=None):
    """Attention of new queries against each sequence's cached rows.

    sequences: a list of S sequence ids, q [S, H, Nq, d]; or one id, q [H, Nq, d]. H must be a
    multiple of the cache's kv_heads (grouped-query as in qkv.attention). Query i of sequence s
    sits at position length(s) - Nq + i: append the new rows first. is_causal (bottom-right:
    query i sees keys up to its own position), scale (default 1/sqrt(d)) and window=(left,
    right) mean what they mean for qkv.attention; the result equals qkv.attention(q_s, K_s, V_s,
    ...) on cache.gather(s) and cache.gather(s, values=True). A mask and the weights output are
    not offered (the key length differs between sequences).

    out_dtype: "float32" or "float64" (default float64 when q is float64, else float32; a
    float16 output is not offered here). Returns the output
    [S, H, Nq, dv] (or [H, Nq, dv]), or qkv.AttentionResult(out, lse, None) with return_lse:
    torch tensors when q is one, else NumPy arrays (a q that requires grad raises qkv.Error
    unless under torch.no_grad(): this does not differentiate).
    Raises qkv.Error on an unknown sequence, heads that do not match the cache, or a window
    reaching a forgotten row. The GIL is released while qkv computes.
    """
    if not isinstance(cache, KVCache):
        raise _qkv.Error(f"cache: expected a qkv.KVCache, got {type(cache).__name__}")
    if isinstance(sequences, numbers.Integral):
        sequences = [sequences]
    torch_out = torch_given(q)
    options = attention_options(is_causal=is_causal, scale=scale, window=window,
                                out_dtype=out_dtype, return_lse=return_lse, threads=threads)
    out, lse, _ = _qkv.attention_cached(as_input(q, "q", "qkv.attention_cached"), cache._cache,
                                        [int(s) for s in sequences], options)
    if return_lse:
        return AttentionResult(as_output(out, torch_out), as_output(lse, torch_out), None)
    return as_output(out, torch_out)

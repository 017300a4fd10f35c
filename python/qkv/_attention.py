"""qkv.attention: softmax(scale · q·kᵀ + mask) · v from Python."""

from collections import namedtuple

from . import _qkv
from ._arrays import as_input
from ._options import attention_options

AttentionResult = namedtuple("AttentionResult", ["out", "lse", "weights"])
AttentionResult.__doc__ = """What qkv.attention returns when an extra output is asked for.

out: [..., Nq, Dv]; lse: the log-sum-exp of each row's scores, [..., Nq] (None unless
return_lse); weights: the softmax weights, [..., Nq, Nk] (None unless return_weights)."""


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, window=None, softcap=None,
              alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, dtype=None,
              return_lse=False, return_weights=False, threads=None, *, out_dtype=None,
              kernel=None, max_memory=None):
    """Self-attention: out_i = softmax(scale · q_i·Kᵀ + mask_i) · V for every query row i.

    q is [B, H, Nq, D], [H, Nq, D] or [Nq, D]; k is [.., Hkv, Nk, D] and v [.., Hkv, Nk, Dv],
    of q's rank and batch. H must be a multiple of Hkv: query head h reads kv head
    h // (H // Hkv) (grouped-query attention, from the shapes alone). Any array works: NumPy
    arrays, torch tensors (on the CPU; through DLPack), anything with __array__. float32,
    float64 and float16 arrays, C-contiguous or strided, are read where they are, never copied;
    the GIL is released while qkv computes.

    Arguments named as torch.nn.functional.scaled_dot_product_attention names them mean what
    they mean there: attn_mask is bool (True = may attend) or float (added to the scaled
    scores), broadcast to [.., Nq, Nk]; scale defaults to 1/sqrt(D). Where qkv differs:
      * is_causal with Nq != Nk is bottom-right aligned (key j is allowed for query i when
        j <= i + Nk - Nq: the last query sees every key), as in FlashAttention; torch aligns
        top-left. With Nq == Nk both are the lower triangle.
      * a query row with no allowed key gives a zero output row, zero weights and lse = -inf
        (torch gives NaN).
      * is_causal may be combined with attn_mask (both apply).

    More than torch has:
      window=(left, right): key j allowed when i + Nk - Nq - left <= j <= i + Nk - Nq + right;
        None or -1 leaves a side unbounded (sliding-window attention).
      softcap=C: scores pass through C·tanh(s / C) (Gemma 2).
      alibi_slopes: ALiBi biases -slope_h·|i + Nk - Nq - j|; an array [H], or True for the
        standard slopes (qkv.alibi_slopes(H)).
      sinks: one logit per query head, [H], in every row's denominator with no value.
      cu_seqlens_q, cu_seqlens_k: a packed batch (int32/int64 offsets [B+1]); q is then
        [H, total_q, D] or [total_q, D]; causal, window and ALiBi count within each sequence.
      dtype: the storage type computed in: "float32", "float64", "bfloat16" or "float16" (a
        NumPy or torch dtype works too). Default: float64 when q, k, v all are float64, float16
        or bfloat16 when they all are stored so, else float32.
      return_lse, return_weights: ask for the log-sum-exp [.., Nq] and the weights [.., Nq, Nk].
      threads: how many threads (None or 0: one per core, fewer for a call too small to share);
        results are bitwise the same for any.
      out_dtype: the output's dtype; default float64 or float16 when q, k, v all are, else
        float32.
      kernel: force one kernel by name (qkv.kernel_names()); max_memory: a byte budget.

    Returns the output as a NumPy array, or an AttentionResult(out, lse, weights) when
    return_lse or return_weights is asked for. Raises qkv.Error (a ValueError) naming the
    argument and the problem on any bad input.
    """
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, out_dtype, return_lse, return_weights, threads,
                                cu_seqlens_q, cu_seqlens_k, kernel, max_memory)
    out, lse, weights, _, _ = _qkv.attention(as_input(q), as_input(k), as_input(v), options)
    if return_lse or return_weights:
        return AttentionResult(out, lse, weights)
    return out

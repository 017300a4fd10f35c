"""qkv.attention: softmax(scale · q·kᵀ + mask) · v from Python."""

import sys
from collections import namedtuple

import numpy as np

from . import _qkv
from ._arrays import all_bfloat16, as_input, as_output, dtype_name, output_dtype, torch_given
from ._options import attention_options

AttentionResult = namedtuple("AttentionResult", ["out", "lse", "weights"])
AttentionGradients = namedtuple("AttentionGradients", ["dq", "dk", "dv", "dsinks"])
AttentionGradients.__doc__ = """What qkv.attention_backward returns: the gradients of
sum(out * grad_out) with respect to q, k, v (each of its input's shape) and the sinks ([H], or
None without sinks); torch tensors when any array argument was one, else NumPy arrays."""
AttentionResult.__doc__ = """What qkv.attention returns when an extra output is asked for.

out: [..., Nq, Dv]; lse: the log-sum-exp of each row's scores, [..., Nq] (None unless
return_lse); weights: the softmax weights, [..., Nq, Nk] (None unless return_weights)."""


def _tokens_first(layout):
    """Whether `layout` ("bhnd", the default, or "bnhd") puts the tokens before the heads."""
    if layout is None or layout == "bhnd":
        return False
    if layout == "bnhd":
        return True
    raise _qkv.Error(f"layout: expected 'bhnd' ([.., H, N, D]) or 'bnhd' ([.., N, H, D]), "
                     f"got {layout!r}")


def _swap_heads(value, name, caller):
    """`value` with its dims -3 and -2 swapped, a view (no copy); fewer than 3 dims: as it is."""
    if value is None:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.transpose(-3, -2) if value.dim() >= 3 else value
    array = as_input(value, name, caller)
    return np.swapaxes(array, -3, -2) if array.ndim >= 3 else array


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, window=None, softcap=None,
              alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, dtype=None,
              return_lse=False, return_weights=False, threads=None, *, out_dtype=None,
              kernel=None, max_memory=None, layout=None, dropout_p=0.0, seed=0,
              dropout_offset=0):
    """Self-attention: out_i = softmax(scale · q_i·Kᵀ + mask_i) · V for every query row i.

    q is [B, H, Nq, D], [H, Nq, D] or [Nq, D]; k is [.., Hkv, Nk, D] and v [.., Hkv, Nk, Dv],
    of q's rank and batch. H must be a multiple of Hkv: query head h reads kv head
    h // (H // Hkv) (grouped-query attention, from the shapes alone). Any array works: NumPy
    arrays, torch tensors (on the CPU; through DLPack), anything with __array__. float32,
    float64 and float16 arrays, C-contiguous or strided, are read where they are, never copied;
    the GIL is released while qkv computes.

    Torch in, torch out: when any array argument (q, k, v, attn_mask, sinks, ...) is a torch
    tensor, the results are torch tensors sharing the memory qkv wrote (no copy), else NumPy
    arrays. out is laid out in memory as q is: when q's heads are interleaved (torch's
    x.view(B, N, H, D).transpose(1, 2), as transformers makes them), out is [B, H, N, Dv] over
    [B, N, H, Dv] memory, as torch's scaled_dot_product_attention returns it; else C order. This function does not differentiate: a tensor that requires grad raises qkv.Error
    while autograd is recording (use qkv.torch.attention, or detach()); under torch.no_grad()
    or torch.inference_mode() it is read like any other.

    Arguments named as torch.nn.functional.scaled_dot_product_attention names them mean what
    they mean there: attn_mask is bool (True = may attend) or float (added to the scaled
    scores), broadcast to [.., Nq, Nk]; scale defaults to 1/sqrt(D). Where qkv differs:
      * is_causal with Nq != Nk is bottom-right aligned (key j is allowed for query i when
        j <= i + Nk - Nq: the last query sees every key), as in FlashAttention; torch aligns
        top-left. With Nq == Nk both are the lower triangle.
      * a query row with no allowed key gives a zero output row, zero weights and lse = -inf
        (torch 2.13's SDPA gives the zero row too; torch before 2.5 gave NaN).
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
      out_dtype: the dtype of every output (out, lse, weights); default float64, float16 or
        (torch tensors only) bfloat16 when q, k, v all are, else float32. A bfloat16 output is
        computed as float32 and rounded once (nearest even); NumPy has no bfloat16, so only a
        torch output can be one.
      kernel: force one kernel by name (qkv.kernel_names()); max_memory: a byte budget.
      layout: "bhnd" (the default: q, k, v as above) or "bnhd": q [B, Nq, H, D] (or
        [Nq, H, D]), k and v [.., Nk, Hkv, D], as transformers and flash-attn keep them; read
        as strided views, and out comes back [.., Nq, H, Dv] (lse and weights keep their
        [.., H, Nq] and [.., H, Nq, Nk]). As qkv attention --layout.
      dropout_p, seed, dropout_offset: attention dropout (training): each weight is dropped
        with probability dropout_p (a number in [0, 1), rounded to a multiple of 2**-16) and
        the kept ones are scaled by 1/(1 - dropout_p). The mask is drawn by Philox4x32-10 from
        the integer seed (in [0, 2**64)), dropout_offset (in [0, 2**32)) and each weight's
        (batch, head, row, key): the same for any thread count; attention_backward given the
        same three values draws it again. return_weights then returns the weights after
        dropout; lse stays the softmax's. Not with a KV cache or ring attention.

    Returns the output (a NumPy array or torch tensor, as above), or an
    AttentionResult(out, lse, weights) when return_lse or return_weights is asked for. Raises
    qkv.Error (a ValueError) naming the argument and the problem on any bad input.
    """
    caller = "qkv.attention"
    torch_out = torch_given(q, k, v, attn_mask, sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
    tokens_first = _tokens_first(layout)
    if tokens_first:
        q, k, v = (_swap_heads(x, name, caller) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    q, k, v = as_input(q, "q", caller), as_input(k, "k", caller), as_input(v, "v", caller)
    out_dtype, to_bfloat16 = output_dtype(out_dtype, torch_out, all_bfloat16(q, k, v))
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, out_dtype, return_lse, return_weights, threads,
                                cu_seqlens_q, cu_seqlens_k, kernel, max_memory, caller=caller,
                                dropout_p=dropout_p, seed=seed, dropout_offset=dropout_offset)
    out, lse, weights, _, _ = _qkv.attention(q, k, v, options)
    if tokens_first and out.ndim >= 3:
        out = np.swapaxes(out, -3, -2)
    out = as_output(out, torch_out, to_bfloat16)
    if return_lse or return_weights:
        # Every output in the output dtype, as float16 gives them (out_dtype applies to all).
        return AttentionResult(out, as_output(lse, torch_out, to_bfloat16),
                               as_output(weights, torch_out, to_bfloat16))
    return out


def attention_backward(q, k, v, out, lse, grad_out, attn_mask=None, is_causal=False, scale=None,
                       window=None, softcap=None, alibi_slopes=None, sinks=None,
                       cu_seqlens_q=None, cu_seqlens_k=None, dtype=None, threads=None, *,
                       kernel=None, max_memory=None, layout=None, dropout_p=0.0, seed=0,
                       dropout_offset=0, grad_dtype=None):
    """The gradients of L = sum(out * grad_out) for out = qkv.attention(q, k, v, ...).

    out and lse are what qkv.attention(q, k, v, ..., return_lse=True) returned for the same
    inputs and options; grad_out (dO) has out's shape. Every option of qkv.attention is taken
    and means what it means there. With P the softmax weights and D_i = sum_c dO_ic·O_ic:
    dV = Pᵀ·dO, dS = P∘(dO·Vᵀ - D) (times 1 - tanh² through a softcap), dQ = scale·dS·K,
    dK = scale·dSᵀ·Q, d sink_h = -sum_i exp(sink_h - lse_i)·D_i; a kv head's dK and dV sum over
    the query heads that read it; a row with no allowed key contributes nothing. Computed by a
    fused FlashAttention-2-style backward, bitwise the same for any thread count.

    The backward computes in the forward's dtype: float64 (q, k, v all float64), bfloat16
    (dtype="bfloat16", or q, k, v all bfloat16: q·k and dO·v as bf16 dot products, P and dS
    rounded to bf16 as operands of dV, dK and dQ, float32 accumulation and a float32 softmax),
    else float32; float16 is refused (pass dtype="float32" or "bfloat16"). grad_dtype: the
    gradients' dtype; default the compute type's, with bfloat16 ones (the float32 sums rounded
    once) for torch outputs only, as NumPy has no bfloat16 (NumPy outputs of a bfloat16 call
    are float32); grad_dtype="float32" keeps the float32 sums. kernel forces a backward kernel (qkv.backward_kernel_names()).
    layout="bnhd": q, k, v, out and grad_out are [.., N, H, D] and so are dq, dk, dv (lse stays
    [.., H, Nq]), as for qkv.attention.
    With dropout (dropout_p, seed, dropout_offset as given to qkv.attention) the mask is drawn
    again, not stored: with Z its factors (1/(1 - p) where kept, 0 where dropped),
    dV = (P∘Z)ᵀ·dO and dS = P∘(Z∘(dO·Vᵀ) - D).
    Returns AttentionGradients(dq, dk, dv, dsinks) (dsinks None without sinks): torch tensors
    when any array argument is one, else NumPy arrays. A tensor that requires grad raises
    qkv.Error while autograd is recording, as for qkv.attention. Raises qkv.Error naming the
    argument on bad input.
    """
    caller = "qkv.attention_backward"
    torch_out = torch_given(q, k, v, out, lse, grad_out, attn_mask, sinks, alibi_slopes,
                            cu_seqlens_q, cu_seqlens_k)
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, None, False, False, threads, cu_seqlens_q,
                                cu_seqlens_k, kernel, max_memory, caller=caller,
                                dropout_p=dropout_p, seed=seed, dropout_offset=dropout_offset)
    grad_name = dtype_name(grad_dtype)
    if grad_name is not None:
        if grad_name in ("bfloat16", "bf16") and not torch_out:
            raise _qkv.Error("grad_dtype: NumPy has no bfloat16; bfloat16 gradients come back "
                             "only as torch tensors (pass torch tensors, or "
                             "grad_dtype='float32')")
        options["grad_dtype"] = grad_name
    tokens_first = _tokens_first(layout)
    if tokens_first:
        q, k, v, out, grad_out = (_swap_heads(x, name, caller) for x, name in (
            (q, "q"), (k, "k"), (v, "v"), (out, "out"), (grad_out, "grad_out")))
    dq, dk, dv, dsinks, _, _, bf16 = _qkv.attention_backward(
        as_input(q, "q", caller), as_input(k, "k", caller), as_input(v, "v", caller),
        as_input(out, "out", caller), as_input(lse, "lse", caller),
        as_input(grad_out, "grad_out", caller), options)
    if tokens_first:
        dq, dk, dv = (np.swapaxes(g, -3, -2) if g.ndim >= 3 else g for g in (dq, dk, dv))
    return AttentionGradients(*(as_output(g, torch_out, bf16) for g in (dq, dk, dv, dsinks)))

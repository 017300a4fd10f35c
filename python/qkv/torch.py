"""qkv.torch: attention that PyTorch can train through, on qkv's forward and backward.

    import torch, qkv.torch
    out = qkv.torch.attention(q, k, v, is_causal=True)    # q.requires_grad: out.backward() works
    layer = qkv.torch.MultiheadAttention(64, 8)           # an nn.Module; its parameters train
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's SDPA

Importing this module imports torch; `import qkv` alone does not. When torch runs its operators
on OpenMP (PyPI's builds do), importing it also puts qkv's threads on torch's OpenMP pool
(qkv.use_openmp_threads); qkv.transformers imports it.
"""

import math

import torch

from . import _qkv
from ._autograd import (Attention as _Attention, autocast_inputs as _autocast_inputs,
                        torch_dropout as _torch_dropout)
from ._sdpa import scaled_dot_product_attention
from ._threads import openmp_threads_library, torch_openmp_library, use_openmp_threads

# qkv's threads on torch's OpenMP pool (qkv.use_openmp_threads says why), unless the process
# already chose a runtime; qkv.use_openmp_threads(None) goes back to qkv's own.
if openmp_threads_library() is None:
    _torch_runtime = torch_openmp_library(torch)
    if _torch_runtime is not None:
        try:
            use_openmp_threads(_torch_runtime)
        except _qkv.Error:
            pass  # not an OpenMP runtime qkv can call: qkv's own threads, as without torch

__all__ = ["attention", "scaled_dot_product_attention", "MultiheadAttention"]


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, window=None, softcap=None,
              alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, dtype=None,
              threads=None, *, dropout_p=0.0, generator=None):
    """qkv.attention on CPU torch tensors, as a torch.autograd.Function.

    The arguments mean what they mean for qkv.attention; the output is a torch tensor of the
    dtype qkv.attention gives for torch inputs (float64 for float64, float32 for float32,
    bfloat16 or float16 when q, k, v all are). Gradients flow to q, k, v and sinks (those that
    require them) through qkv.attention_backward, the fused backward; attn_mask, alibi_slopes
    and the offsets get none. A bfloat16 computation (bfloat16 inputs, or dtype="bfloat16")
    has qkv's bfloat16 backward (bf16 dot products, float32 accumulation and softmax); a
    float16 one is differentiated in float32 (qkv has no float16 backward), reading the
    float16 inputs as they are; the gradients come back in each input's dtype. Under
    torch.autocast("cpu", dtype=torch.bfloat16), float32 q, k, v are cast to bfloat16 first
    (as autocast does for torch's matmuls and SDPA): the forward and the backward run in
    bfloat16, the output is bfloat16 and the gradients reach q, k, v in float32.

    dropout_p > 0 drops attention weights with that probability (the kept ones scaled by
    1/(1 - dropout_p)), as torch's SDPA does: the seed is drawn from torch's generator
    (`generator`, or the default one), so torch.manual_seed reproduces the mask, and the
    backward draws the same mask again (qkv.attention's dropout_p and seed).
    """
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        # A NumPy array (or a list) takes no gradient; as a tensor it passes through autograd's
        # bookkeeping like any other input.
        try:
            sinks = torch.as_tensor(sinks)
        except (TypeError, ValueError, RuntimeError) as e:
            raise _qkv.Error(f"sinks: expected a torch tensor or an array of [H] logits, got "
                             f"{type(sinks).__name__} ({e})") from None
    options = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale,
               "window": window, "softcap": softcap, "alibi_slopes": alibi_slopes,
               "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, "dtype": dtype,
               "threads": threads, **_torch_dropout(dropout_p, generator)}
    q, k, v = _autocast_inputs(q, k, v)
    return _Attention.apply(q, k, v, sinks, options)


class MultiheadAttention(torch.nn.Module):
    """A multi-head attention layer whose attention runs on qkv, forward and backward.

    Q = X·W_q + b_q, K = M·W_k + b_k, V = M·W_v + b_v (M = X, or `memory` for
    cross-attention), heads of head_dim columns (kv_heads of them for K and V: grouped-query
    attention), out = concat(heads)·W_o + b_o. Weights are stored in qkv's X·W layout
    ([in, out], the transpose of nn.Linear's) and initialised as nn.Linear initialises its
    own: uniform in ±1/sqrt(in). forward takes X [B, N, embed_dim] or [N, embed_dim].

    dropout: attention dropout in training mode (module.train(), the default), as
    torch.nn.MultiheadAttention's: each head's weights dropped with that probability, the kept
    ones scaled by 1/(1 - dropout); none in eval mode. Each forward draws its seed from torch's
    generator (torch.manual_seed reproduces the masks) and its backward draws the same masks
    again. forward(..., dropout_p=P) overrides it for one call, in either mode.
    """

    def __init__(self, embed_dim, num_heads, kv_heads=None, bias=True, kdim=None,
                 head_dim=None, dtype=torch.float32, *, dropout=0.0):
        super().__init__()
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not (
                0.0 <= dropout < 1.0):
            raise _qkv.Error(f"dropout: must be a number in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)
        kv_heads = kv_heads or num_heads
        if embed_dim <= 0 or num_heads <= 0 or num_heads % kv_heads != 0:
            raise ValueError("embed_dim and num_heads must be positive and kv_heads must "
                             "divide num_heads")
        head_dim = head_dim or embed_dim // num_heads
        kdim = kdim or embed_dim
        self.num_heads, self.kv_heads, self.head_dim = num_heads, kv_heads, head_dim

        def weight(rows, cols):
            w = torch.empty(rows, cols, dtype=dtype)
            torch.nn.init.uniform_(w, -1 / math.sqrt(rows), 1 / math.sqrt(rows))
            return torch.nn.Parameter(w)

        def bias_of(rows, cols):
            if not bias:
                return None
            b = torch.empty(cols, dtype=dtype)
            torch.nn.init.uniform_(b, -1 / math.sqrt(rows), 1 / math.sqrt(rows))
            return torch.nn.Parameter(b)

        width_q, width_kv = num_heads * head_dim, kv_heads * head_dim
        self.wq, self.bq = weight(embed_dim, width_q), bias_of(embed_dim, width_q)
        self.wk, self.bk = weight(kdim, width_kv), bias_of(kdim, width_kv)
        self.wv, self.bv = weight(kdim, width_kv), bias_of(kdim, width_kv)
        self.wo, self.bo = weight(width_q, embed_dim), bias_of(width_q, embed_dim)

    @staticmethod
    def _project(x, w, b):
        y = x @ w
        return y if b is None else y + b

    def _heads(self, y, heads):
        # [..., N, heads·head_dim] -> [..., heads, N, head_dim], a strided view (no copy)
        return y.unflatten(-1, (heads, self.head_dim)).transpose(-3, -2)

    def forward(self, x, memory=None, is_causal=False, attn_mask=None, **options):
        options.setdefault("dropout_p", self.dropout if self.training else 0.0)
        m = x if memory is None else memory
        q = self._heads(self._project(x, self.wq, self.bq), self.num_heads)
        k = self._heads(self._project(m, self.wk, self.bk), self.kv_heads)
        v = self._heads(self._project(m, self.wv, self.bv), self.kv_heads)
        o = attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)
        return self._project(o.transpose(-3, -2).flatten(-2), self.wo, self.bo)

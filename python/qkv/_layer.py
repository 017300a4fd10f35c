"""qkv.MultiHeadAttention and qkv.linear: the layer in the classic explanation's X·W layout, and
its backward."""

from collections import namedtuple

import numpy as np

from . import _qkv
from ._arrays import all_bfloat16, as_input, as_output, output_dtype, torch_given
from ._attention import AttentionResult
from ._options import attention_options

__all__ = ["MultiHeadAttention", "LayerGradients", "LayerState", "linear"]

_WEIGHT_NAMES = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")

LayerGradients = namedtuple("LayerGradients", ["dx", "dmemory", "dwq", "dwk", "dwv", "dwo", "dbq",
                                               "dbk", "dbv", "dbo", "dsinks"])
LayerGradients.__doc__ = """The gradients MultiHeadAttention.backward returns: dx (x's shape),
dmemory (the memory's; None without one), dwq, dwk, dwv, dwo and dbq, dbk, dbv, dbo (each its
weight's shape; None where the layer has no such weight), dsinks ([heads]; None without sinks)."""


class LayerState:
    """What MultiHeadAttention.__call__(..., return_state=True) keeps for the layer's backward:
    the forward's projections, heads and lse (so that the backward computes none of them
    again), the inputs x and memory and the call's options. Pass it to the same layer's
    backward, any number of times; it holds its own copy of what the forward computed, but x,
    memory and the weights as given (no copies): change them and the state no longer matches."""

    __slots__ = ("_layer", "_x", "_memory", "_options", "_state", "_torch_out", "_shape")

    def __init__(self, layer, x, memory, options, state, torch_out, shape):
        self._layer, self._x, self._memory, self._options = layer, x, memory, options
        self._state, self._torch_out, self._shape = state, torch_out, shape

    def __repr__(self):
        return f"qkv.LayerState(x={list(self._shape)}, memory={self._memory is not None})"


def linear(x, w, bias=None, threads=None):
    """x·w + bias: [..., N, d] · [d, n_out] -> [..., N, n_out].

    The X·W layout: w is [d, n_out], the transpose of a torch.nn.Linear weight (which computes
    x·Wᵀ + b). float32 when x, w and bias all are float32 (or narrower), float64 otherwise.
    A torch tensor among x, w, bias gives a torch tensor back (else NumPy); one that requires
    grad raises qkv.Error while autograd records (this does not differentiate).
    Raises qkv.Error naming the argument on a shape mismatch or a non-finite value.
    """
    caller = "qkv.linear"
    out = _qkv.linear(as_input(x, "x", caller), as_input(w, "w", caller),
                      as_input(bias, "bias", caller), threads)
    return as_output(out, torch_given(x, w, bias))


def _shape(array):
    if isinstance(array, tuple):  # ("bfloat16", bits)
        return array[1].shape
    return np.shape(array)


class MultiHeadAttention:
    """The multi-head attention layer of the classic explanation, in the X·W layout:

        Q = X·W^Q + b^Q,  K = M·W^K + b^K,  V = M·W^V + b^V     (M = X unless memory is given)
        head h = attention(Q_h, K_g, V_g),  g = h // (heads // kv_heads)
        out = concat_h(head h)·W^O + b^O     (the concatenation itself without W^O)

    W^Q is [d, heads·dk], W^K [d_m, kv_heads·dk], W^V [d_m, kv_heads·dv], W^O [heads·dv, d_out];
    biases are 1-D of the matching width. These are the transposes of torch.nn.Linear weights
    (see from_torch). The arrays (NumPy, torch, DLPack or __array__) are converted once, here,
    without copying, and checked against each other: a mismatch raises qkv.Error naming them.
    kv_heads < heads is grouped-query attention (default: kv_heads = heads). Torch weights
    that require grad raise qkv.Error unless given under torch.no_grad(): this layer is no
    torch autograd function (qkv.torch.MultiheadAttention is). Its gradients come explicitly:
    `out, state = layer(x, ..., return_state=True)`, then `layer.backward(grad_out, state)`.
    """

    def __init__(self, wq, wk, wv, wo=None, bq=None, bk=None, bv=None, bo=None, *, heads,
                 kv_heads=None):
        names = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")
        weights = (wq, wk, wv, wo, bq, bk, bv, bo)
        self._weights = tuple(as_input(w, n, "qkv.MultiHeadAttention")
                              for w, n in zip(weights, names))
        # Torch weights make the layer's results torch tensors, whatever x is.
        self._torch_weights = torch_given(*weights)
        self.heads = int(heads)
        self.kv_heads = self.heads if kv_heads is None else int(kv_heads)
        if self.kv_heads < 1:  # the library's 0 ("as many as heads") is None here
            raise _qkv.Error(f"kv_heads: must be at least 1 (None: as many as heads), got "
                             f"{self.kv_heads}")
        self._check()

    def _check(self):
        # A call with no rows runs every check of shapes and values and computes nothing.
        wq, wk = _shape(self._weights[0]), _shape(self._weights[1])
        d = wq[0] if len(wq) == 2 else 1
        d_m = wk[0] if len(wk) == 2 else d
        memory = np.zeros((0, d_m), np.float32) if d_m != d else None
        self._call(np.zeros((0, d), np.float32), memory, attention_options())

    def __getattr__(self, name):
        if name in _WEIGHT_NAMES:
            return self._weights[_WEIGHT_NAMES.index(name)]
        raise AttributeError(name)

    def __repr__(self):
        wq, wv = _shape(self._weights[0]), _shape(self._weights[2])
        present = [n for n, w in zip(_WEIGHT_NAMES, self._weights) if w is not None]
        return (f"qkv.MultiHeadAttention(d={wq[0] if wq else '?'}, heads={self.heads}, "
                f"kv_heads={self.kv_heads}, dv={wv[-1] // self.kv_heads if wv else '?'}, "
                f"weights={'/'.join(present)})")

    def _call(self, x, memory, options, keep_state=False):
        return _qkv.multi_head_attention(x, memory, self._weights, self.heads, self.kv_heads,
                                         options, keep_state)

    def __call__(self, x, memory=None, attn_mask=None, is_causal=False, scale=None, window=None,
                 softcap=None, alibi_slopes=None, sinks=None, return_lse=False,
                 return_weights=False, threads=None, dtype=None, out_dtype=None,
                 return_state=False, *, dropout_p=0.0, seed=0, dropout_offset=0):
        """The layer on samples x, [B, N, d] or [N, d] (one sample per row).

        memory: cross-attention's source of K and V, [B, Nk, d_m] or [Nk, d_m] (same rank and
        batch as x). The other arguments mean what they mean for qkv.attention: attn_mask
        (bool, True = may attend; or float, added to the scaled scores) broadcasts to
        [B, heads, N, Nk] ([heads, N, Nk] for a 2-D x) — note that torch.nn.MultiheadAttention's
        bool masks mean the opposite (True = masked out); is_causal is bottom-right aligned;
        scale defaults to 1/sqrt(dk); window, softcap, alibi_slopes ([heads] or True), sinks
        ([heads]) and dtype (the storage type the heads' attention computes in: "bfloat16",
        "float16", ...) as there. The projections compute in float32 when x, the weights and the
        output are all float32 or float16 (or bfloat16), else in float64.

        out_dtype: default float64, float16 or (torch only) bfloat16 when x and every weight are
        stored so, else float32. Returns the output [.., N, d_out] ([.., N, heads·dv] without
        W^O), or qkv.AttentionResult(out, lse, weights) when return_lse or return_weights is
        asked for: lse [B, heads, N], weights [B, heads, N, Nk] per head (not averaged over
        heads, unlike torch's default). Torch tensors when x, memory, a mask, sinks or the
        layer's weights are torch tensors, else NumPy arrays (see qkv.attention). The GIL is
        released while qkv computes.

        return_state: also keep what the backward needs; the call then returns the pair
        (result, state), result as above and state a qkv.LayerState for self.backward.

        dropout_p, seed, dropout_offset: attention dropout (training), as for qkv.attention:
        each head's weights are dropped with probability dropout_p (a number in [0, 1)) and the
        kept ones scaled by 1/(1 - dropout_p); head h of batch b draws the mask qkv.attention
        draws for (b, h) on the projected heads [B, heads, N, dk] with the same seed (an
        integer in [0, 2**64)) and dropout_offset (one in [0, 2**32)). self.backward draws the
        same mask again from the state. weights are those after dropout; lse the softmax's.
        """
        torch_out = self._torch_weights or torch_given(x, memory, attn_mask, alibi_slopes, sinks)
        bfloat16_in = all_bfloat16(x, memory, *(w for w in self._weights if w is not None))
        out_dtype, to_bfloat16 = output_dtype(out_dtype, torch_out, bfloat16_in)
        options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                    sinks, dtype, out_dtype, return_lse, return_weights, threads,
                                    caller="qkv.MultiHeadAttention", dropout_p=dropout_p,
                                    seed=seed, dropout_offset=dropout_offset)
        caller = "qkv.MultiHeadAttention"
        x_in, memory_in = as_input(x, "x", caller), as_input(memory, "memory", caller)
        out, lse, weights, _, state = self._call(x_in, memory_in, options, return_state)
        out = as_output(out, torch_out, to_bfloat16)
        if return_lse or return_weights:
            out = AttentionResult(out, as_output(lse, torch_out, to_bfloat16),
                                  as_output(weights, torch_out, to_bfloat16))
        if return_state:
            return out, LayerState(self, x_in, memory_in, options, state, torch_out, _shape(x_in))
        return out

    def backward(self, grad_out, state, *, threads=None, kernel=None):
        """The gradients of L = sum(out * grad_out) for out = self(x, ...), from the state that
        call kept (return_state=True): grad_out has out's shape (any float dtype).

        The chain rule through the layer: dConcat = grad_out·W^Oᵀ, dW^O = Concatᵀ·grad_out,
        db^O = the column sums of grad_out; each head's dQ, dK, dV from qkv.attention_backward
        (every option of the forward honoured: mask, causal, window, softcap, ALiBi, sinks,
        grouped-query heads, and dropout, whose mask is drawn again); dW^Q = Xᵀ·dQ, db^Q = the
        column sums of dQ, dX = dQ·W^Qᵀ, and dK·W^Kᵀ + dV·W^Vᵀ added to dX (or, with a memory,
        making dmemory). Computed in float64 when the forward computed in float64, else in
        float32 (a bfloat16 or float16 dtype= is refused, as by qkv.attention_backward);
        bitwise the same for any thread count.

        threads: as for the forward (default: the forward's); kernel forces a backward kernel
        (qkv.backward_kernel_names()). Returns qkv.LayerGradients: torch tensors when the
        forward's results were, or grad_out is one, else NumPy arrays. Raises qkv.Error naming
        the argument on bad input (a state of another layer, a grad_out of the wrong shape).
        """
        caller = "qkv.MultiHeadAttention.backward"
        if not isinstance(state, LayerState):
            raise _qkv.Error(f"state: expected the qkv.LayerState of a call with "
                             f"return_state=True, got {type(state).__name__}")
        if state._layer is not self:
            raise _qkv.Error("state: is the state of another layer's call")
        options = dict(state._options)
        if threads is not None:
            options["threads"] = threads
        options["kernel"] = kernel
        torch_out = state._torch_out or torch_given(grad_out)
        *grads, _ = _qkv.multi_head_attention_backward(
            state._x, state._memory, self._weights, self.heads, self.kv_heads, options,
            as_input(grad_out, "grad_out", caller), state._state)
        return LayerGradients(*(as_output(g, torch_out) for g in grads))

    def explain(self, x, memory=None, *, attn_mask=None, is_causal=False, scale=None,
                window=None, softcap=None, alibi_slopes=None, sinks=None, dtype=None,
                threads=None, query_labels=None, key_labels=None, title=None, batch=0):
        """The walk-through of this layer's attention on x (batch element `batch` of a batched
        x): a qkv.Explanation whose Q, K and V are exactly the projections __call__ makes, with
        x_i shown beside q_i and m_j beside k_j and v_j. Options as for __call__; labels name
        the query rows and key rows (one string each)."""
        from ._explain import explain_layer
        return explain_layer(self, x, memory, attention_options(
            attn_mask, is_causal, scale, window, softcap, alibi_slopes, sinks, dtype,
            threads=threads, caller="qkv.MultiHeadAttention.explain"), query_labels, key_labels,
            title, batch)

    @classmethod
    def from_torch(cls, module):
        """The layer of a torch.nn.MultiheadAttention, with its weights (copied once, transposed
        into the X·W layout) and its heads.

        The result takes qkv's layout, x [B, N, E] (batch first) or [N, E], whatever the
        module's batch_first says: torch's forward takes [L, N, E] unless batch_first. With
        kdim/vdim set (separate q/k/v_proj_weight), pass the keys' and values' source as
        `memory` — qkv takes one memory for both, so kdim must equal vdim. Dropout is not
        applied (the module in eval mode). bias_k/bias_v (add_bias_kv) and add_zero_attn have
        no counterpart in qkv and raise qkv.Error naming them.
        """
        for unsupported in ("bias_k", "bias_v"):
            if getattr(module, unsupported, None) is not None:
                raise _qkv.Error(f"{unsupported}: torch's add_bias_kv has no counterpart in qkv")
        if getattr(module, "add_zero_attn", False):
            raise _qkv.Error("add_zero_attn: torch's add_zero_attn has no counterpart in qkv")
        if module.kdim != module.vdim:
            raise _qkv.Error(f"kdim: qkv takes one memory for keys and values, so kdim "
                             f"({module.kdim}) must equal vdim ({module.vdim})")

        def columns(weight):  # a Linear weight [out, in] -> [in, out], contiguous
            return None if weight is None else np.ascontiguousarray(
                weight.detach().cpu().numpy().T)

        def numpy(tensor):
            return None if tensor is None else tensor.detach().cpu().numpy().copy()

        e = module.embed_dim
        if module.in_proj_weight is not None:
            wq, wk, wv = (columns(module.in_proj_weight[i * e:(i + 1) * e]) for i in range(3))
        else:
            wq, wk, wv = (columns(w) for w in (module.q_proj_weight, module.k_proj_weight,
                                               module.v_proj_weight))
        bq = bk = bv = None
        if module.in_proj_bias is not None:
            bq, bk, bv = (numpy(module.in_proj_bias[i * e:(i + 1) * e]) for i in range(3))
        return cls(wq, wk, wv, columns(module.out_proj.weight), bq, bk, bv,
                   numpy(module.out_proj.bias), heads=module.num_heads)

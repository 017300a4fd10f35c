"""qkv.torch.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's
signature and meaning (torch 2.x), computed by qkv forward and backward.

What torch allows is mapped onto what qkv reads, by views wherever a view will do:
  * leading dims: torch broadcasts the batch dims of query, key, value (and the mask against
    the output); here they are expanded (stride 0, no copy) and folded into qkv's [B, H, L, E]
    (a copy only when dims that cannot merge into one stride must merge: five or more dims
    with broadcasting). Expanding before the autograd Function lets autograd sum the gradients
    over broadcast dims.
  * heads: with enable_gqa, key/value heads Hkv dividing H are qkv's grouped-query attention
    as they are; key and value with different head counts are repeated to H (a copy). Without
    it, head counts must broadcast (1 or equal), as torch requires.
  * is_causal: torch aligns top-left (key j allowed for query i iff j <= i), qkv bottom-right.
    L <= S: keys past L are never allowed, so key and value are cut to their first L rows (a
    view) and qkv's causal is square; L > S: qkv's window=(None, L - S) is exactly j <= i.
  * torch.nn.attention.bias's causal_upper_left(L, S) is is_causal; causal_lower_right(L, S)
    is qkv's own causal (bottom-right), with no mask materialised either way.
  * fully masked rows: torch 2.13 (CPU, both backends) gives zero output rows and zero
    gradients; so does qkv.
"""

import math

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import _qkv
from ._arrays import check_tensor
from ._autograd import Attention, autocast_inputs, torch_dropout

_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _checked(name, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise _qkv.Error(f"{name}: expected a torch tensor, got {type(tensor).__name__}")
    check_tensor(tensor, name)
    return tensor


def _check_inputs(query, key, value):
    for name, t in (("query", query), ("key", key), ("value", value)):
        _checked(name, t)
        if t.dtype not in _DTYPES:
            raise _qkv.Error(f"{name}: dtype {_name(t.dtype)} is not one qkv computes in "
                             f"(float32, float64, bfloat16, float16)")
        if t.dim() < 2:
            raise _qkv.Error(f"{name}: expected at least 2 dims (..., rows, features), got "
                             f"{t.dim()}")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise _qkv.Error(f"{name}: dtype {_name(t.dtype)} differs from query's "
                             f"{_name(query.dtype)} (query, key and value share one dtype)")
    if key.shape[-1] != query.shape[-1]:
        raise _qkv.Error(f"key: {key.shape[-1]} features per row differ from query's "
                         f"{query.shape[-1]}")
    if value.shape[-2] != key.shape[-2]:
        raise _qkv.Error(f"value: {value.shape[-2]} rows differ from key's {key.shape[-2]}")


def _check_mask(mask, query, is_causal):
    _checked("attn_mask", mask)
    if is_causal:
        raise _qkv.Error("attn_mask: give attn_mask or is_causal=True, not both (as torch "
                         "documents; qkv.torch.attention applies both)")
    if mask.dtype not in (torch.bool, torch.float32, query.dtype):
        raise _qkv.Error(f"attn_mask: dtype {_name(mask.dtype)} is neither bool nor float32 "
                         f"nor query's {_name(query.dtype)}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise _qkv.Error("attn_mask: requires grad; qkv computes no gradient for a mask "
                         "(pass attn_mask.detach())")


def _broadcast_shapes(*shapes):
    """torch.broadcast_shapes for plain shapes, as a tuple (raises RuntimeError where it does):
    torch's own took a quarter of a small call's time in Python."""
    rank = max(len(shape) for shape in shapes)
    result = [1] * rank
    for shape in shapes:
        for axis, size in enumerate(shape, rank - len(shape)):
            if size != result[axis] and size != 1:
                if result[axis] != 1:
                    raise RuntimeError(f"shapes {shapes} do not broadcast")
                result[axis] = size
    return tuple(result)


def _padded(t, dims):
    """t with leading dims of 1 up to `dims` dims (a view)."""
    return t[(None,) * (dims - t.dim())] if t.dim() < dims else t


def _heads(hq, hk, hv, enable_gqa, query_dims):
    """The output's head count, refusing what torch refuses."""
    if enable_gqa:
        if query_dims < 3:
            raise _qkv.Error("enable_gqa: needs a head dim (query of 3 or more dims)")
        if hk == 0 or hv == 0 or hq % hk or hq % hv:
            if not (hq == hk == hv == 0):
                raise _qkv.Error(f"enable_gqa: key's {hk} and value's {hv} heads must divide "
                                 f"query's {hq}")
        return hq
    try:
        return _broadcast_shapes((hq,), (hk,), (hv,))[0]
    except RuntimeError:
        raise _qkv.Error(f"key: {hk} heads (value {hv}) do not broadcast with query's {hq} "
                         f"(grouped-query attention needs enable_gqa=True)") from None


def _fold(t, batch, heads):
    """t [*, h, rows, cols] expanded to batch + (heads, rows, cols) and folded to 4 dims."""
    shape = tuple(batch) + (heads,) + tuple(t.shape[-2:])
    return t.expand(shape).reshape((math.prod(batch), heads) + tuple(t.shape[-2:]))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, computed by qkv: differentiable
    (qkv's fused backward), a drop-in on the CPU:

        torch.nn.functional.scaled_dot_product_attention = qkv.torch.scaled_dot_product_attention

    softmax(query·keyᵀ·scale + mask)·value over the last two dims; query (N, ..., Hq, L, E),
    key (N, ..., H, S, E), value (N, ..., H, S, Ev): leading dims broadcast; attn_mask (bool,
    True = may attend; or float32 / query's dtype, added to the scores) broadcasts to
    (N, ..., Hq, L, S), or is torch.nn.attention.bias.causal_upper_left / causal_lower_right;
    is_causal is torch's top-left triangle (key j for query i iff j <= i) and excludes
    attn_mask; scale defaults to 1/sqrt(E); enable_gqa lets key/value have fewer
    heads dividing Hq (query head h reads head h // (Hq / H)). float32, float64, bfloat16
    (qkv's bfloat16 kernel) and float16; the output has query's dtype. A row with no allowed
    key gives zeros and zero gradients, as torch 2.13 does.

    dropout_p > 0 drops weights as torch does (kept ones scaled by 1/(1 - dropout_p)), with
    qkv's own mask (Philox4x32-10, not torch's stream): its seed is drawn from torch's default
    generator, so torch.manual_seed reproduces a run, and the backward draws the same mask.

    Gradients flow to query, key and value; bfloat16 ones come from qkv's bfloat16 backward,
    float16 ones are computed in float32 (qkv has no float16 backward) and rounded. Under
    torch.autocast("cpu", dtype=torch.bfloat16) float32 query, key and value are cast to
    bfloat16 first, as autocast casts them for torch's own SDPA: the bfloat16 forward and
    backward run, the output is bfloat16 and the gradients reach the float32 tensors. Where qkv differs from
    torch, it raises qkv.Error (a ValueError) in one line naming the argument: dropout_p outside
    [0, 1), a float attn_mask that requires grad (no mask gradient), NaN or
    infinite inputs, a +inf in the mask or a non-finite scale (torch returns NaN), a tensor
    off the CPU, nested or sparse, an integer or complex dtype.
    """
    _check_inputs(query, key, value)
    query, key, value = autocast_inputs(query, key, value)
    dropout = torch_dropout(dropout_p)
    bottom_right = False
    if isinstance(attn_mask, CausalBias):
        if is_causal:
            raise _qkv.Error("attn_mask: a CausalBias should not be used with is_causal=True")
        if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (query.shape[-2], key.shape[-2]):
            raise _qkv.Error(f"attn_mask: a CausalBias for {attn_mask.seq_len_q} queries and "
                             f"{attn_mask.seq_len_kv} keys, given {query.shape[-2]} and "
                             f"{key.shape[-2]}")
        is_causal = attn_mask.variant == CausalVariant.UPPER_LEFT
        bottom_right = attn_mask.variant == CausalVariant.LOWER_RIGHT
        attn_mask = None
    if attn_mask is not None:
        _check_mask(attn_mask, query, is_causal)
    dims = max(query.dim(), key.dim(), value.dim(), 3)
    q, k, v = (_padded(t, dims) for t in (query, key, value))
    heads = _heads(q.shape[-3], k.shape[-3], v.shape[-3], enable_gqa, query.dim())
    try:
        batch = _broadcast_shapes(*(tuple(t.shape[:-3]) for t in (q, k, v)))
    except RuntimeError:
        raise _qkv.Error(f"key: leading dims {tuple(key.shape[:-2])} do not broadcast with "
                         f"query's {tuple(query.shape[:-2])}") from None
    kv_heads = k.shape[-3]
    if k.shape[-3] != v.shape[-3]:
        kv_heads = heads
        k, v = (t.repeat_interleave(heads // t.shape[-3], dim=-3) if enable_gqa else t
                for t in (k, v))
    rows, keys = q.shape[-2], k.shape[-2]
    q4, k4, v4 = _fold(q, batch, heads), _fold(k, batch, kv_heads), _fold(v, batch, kv_heads)
    lead = (tuple(batch) + (heads,)) if max(query.dim(), key.dim(), value.dim()) > 2 else ()
    mask4 = None
    if attn_mask is not None:
        scores = tuple(batch) + (heads, rows, keys)
        try:
            fits = _broadcast_shapes(tuple(attn_mask.shape), scores) == scores
        except RuntimeError:
            fits = False
        if not fits:
            raise _qkv.Error(f"attn_mask: shape {tuple(attn_mask.shape)} does not broadcast to "
                             f"the scores' {tuple(lead) + (rows, keys)}")
        m = attn_mask
        if m.dtype in (torch.bfloat16, torch.float16):
            m = m.float()  # qkv reads float32/float64 masks; widening is exact
        m = m.reshape(m.shape[m.dim() - dims:]) if m.dim() > dims else _padded(m, dims)
        mask4 = m.expand(tuple(batch) + tuple(m.shape[-3:])).reshape(
            (math.prod(batch),) + tuple(m.shape[-3:]))
    window = None
    if is_causal and rows <= keys:
        k4, v4 = k4[..., :rows, :], v4[..., :rows, :]
    elif is_causal:
        window = (None, rows - keys)
    causal = bottom_right or (bool(is_causal) and window is None)
    options = {"attn_mask": mask4, "is_causal": causal,
               "scale": None if scale is None else float(scale), "window": window,
               "softcap": None, "alibi_slopes": None, "cu_seqlens_q": None,
               "cu_seqlens_k": None, "dtype": None, "threads": None, **dropout}
    try:
        out = Attention.apply(q4, k4, v4, None, options)
    except _qkv.Error as e:  # qkv names q, k, v; this function's arguments are named in full
        subject, _, rest = str(e).partition(": ")
        names = {"q": "query", "k": "key", "v": "value"}
        raise _qkv.Error(f"{names.get(subject, subject)}: {rest}") from None
    return out.reshape(tuple(lead) + (rows, value.shape[-1]))

"""qkv.transformers: Hugging Face transformers models whose attention runs on qkv.

    import qkv.transformers
    model = AutoModel.from_pretrained(path, attn_implementation="qkv")

Importing this module registers "qkv" with transformers' AttentionInterface (the attention
every layer calls, forward and backward through qkv.torch.attention) and AttentionMaskInterface
(the masks the model builds for it). Importing it imports torch and transformers; `import qkv`
alone imports neither.

The masks. qkv applies causal and sliding-window masks from two numbers, bottom-right aligned
(the last query sees the last key), so the mask function hands over only what those cannot say:
  * None: no padding. Causal from the layer (its is_causal), the window from the model's
    sliding_window argument, as the FlashAttention integration reads them.
  * a [B, Nk] bool key-padding mask (True = a real token): a causal pattern plus padding.
  * a 4D mask [B, 1, Nq, Nk]: anything else (a static cache whose keys run past the queries,
    packed sequences, a model's own mask functions); it says everything and nothing is added.
Bottom-right alignment is the model's own causal rule whenever the last query's position is the
last key's (q_offset + Nq == kv_offset + Nk): training, prefill and decode with a DynamicCache,
and its sliding-window layers. The mask function checks that before it uses the short forms.

What qkv cannot do it refuses, with a qkv.Error naming the option, rather than compute something
else: output_attentions (the weights), a position bias, per-token sinks, tensors off the CPU
and dtypes other than float32, float64, bfloat16, float16. Attention dropout in training mode is
qkv's own (its seed drawn from torch's default generator: torch.manual_seed reproduces a run).
"""

import torch
import transformers
from transformers import masking_utils
from transformers.masking_utils import AttentionMaskInterface

from . import _qkv
from ._attention import attention as _attention
from ._autograd import torch_dropout as _torch_dropout
from .torch import attention as _attention_with_grad

__all__ = ["attention_forward", "attention_mask", "NAME"]

NAME = "qkv"
_FLOAT_DTYPES = (torch.float32, torch.float64)
_16BIT_DTYPES = (torch.bfloat16, torch.float16)


def _closure(function):
    """A closure's free variables by name ({} for a plain function)."""
    cells = function.__closure__ or ()
    return {name: cell.cell_contents for name, cell in zip(function.__code__.co_freevars, cells)}


def _causal_window(mask_function, local_size):
    """What a transformers mask function is, when it is one qkv applies from numbers: "causal"
    (causal_mask_function, or the sliding-window causal function of width local_size) or
    "bidirectional"; None for anything else (which is then materialised)."""
    if mask_function is masking_utils.causal_mask_function:
        return "causal"
    if mask_function is masking_utils.bidirectional_mask_function:
        return "bidirectional"
    # create_sliding_window_causal_mask's and_masks(sliding_window_overlay(W), causal): read
    # the pair out of the closure and accept it only when W is the local size it was given.
    if local_size is None or not mask_function.__qualname__.startswith("and_masks."):
        return None
    parts = _closure(mask_function).get("mask_functions", ())
    if (len(parts) == 2 and parts[1] is masking_utils.causal_mask_function
            and parts[0].__qualname__.startswith("sliding_window_overlay.")
            and _closure(parts[0]).get("sliding_window") == local_size):
        return "causal"
    return None


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=masking_utils.causal_mask_function, attention_mask=None,
                   local_size=None, **kwargs):
    """The mask for a model with attn_implementation="qkv" (registered with
    AttentionMaskInterface): None, a [B, Nk] key-padding mask or a 4D bool mask, as the module
    docstring says."""
    kind = _causal_window(mask_function, local_size)
    aligned = (not isinstance(q_offset, torch.Tensor)
               and q_offset + q_length == kv_offset + kv_length)
    if kind == "bidirectional" or (kind == "causal" and aligned):
        padding = masking_utils.prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is not None:
            padding = padding[:, kv_offset:kv_offset + kv_length]
            if masking_utils.fast_all(padding):
                padding = None
        if padding is None:
            return None
        # Bidirectional padding is a complete mask by itself: 4D, broadcast over heads and rows.
        return padding if kind == "causal" else padding[:, None, None, :]
    kwargs.pop("allow_is_causal_skip", None)
    kwargs.pop("allow_is_bidirectional_skip", None)
    return masking_utils.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                   mask_function, attention_mask, local_size=local_size,
                                   allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                                   **kwargs)


def _refuse(module, query, kwargs):
    """qkv.Error naming the model option qkv cannot honour, if there is one."""
    if kwargs.get("output_attentions") or getattr(getattr(module, "config", None),
                                                  "output_attentions", False):
        raise _qkv.Error("output_attentions: qkv does not return the attention weights to a "
                         "transformers model; use attn_implementation=\"eager\" to see them")
    for name in ("position_bias", "head_mask", "sinks"):
        if kwargs.get(name) is not None:
            raise _qkv.Error(f"{name}: the model passes a {name.replace('_', ' ')} to its "
                             f"attention, which attn_implementation=\"qkv\" does not take")
    if query.device.type != "cpu":
        raise _qkv.Error(f"device: the model is on {query.device}; qkv computes on the CPU "
                         f"(model.to(\"cpu\"))")
    if query.dtype not in _FLOAT_DTYPES + _16BIT_DTYPES:
        raise _qkv.Error(f"dtype: the model computes in {query.dtype}; qkv takes float32, "
                         f"float64, bfloat16 and float16")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention signature: query [B, H, Nq, D], key and value [B, Hkv, Nk, D]
    (grouped-query attention from the shapes, no repeat_kv) -> ([B, Nq, H, Dv], None).

    scaling, softcap (Gemma 2's attn_logit_softcapping), sliding_window (keys within
    sliding_window - 1 before the query) and s_aux (GPT-OSS's sinks, one logit per head) go to
    qkv as scale, softcap, window and sinks; gradients reach query, key, value and s_aux.
    dropout (the model's attention dropout in training mode) is qkv's attention dropout, its
    seed drawn from torch's default generator."""
    _refuse(module, query, kwargs)
    if attention_mask is None:
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        mask = None
    elif attention_mask.dim() == 2:  # this module's key padding of a causal pattern
        causal = True
        mask = attention_mask[:, None, None, :]
    else:
        causal = False
        mask = attention_mask
    causal = bool(causal)
    window = (sliding_window - 1, 0) if causal and sliding_window is not None else None
    if s_aux is not None and tuple(s_aux.shape) != (query.shape[1],):
        raise _qkv.Error(f"s_aux: the model's sinks are {tuple(s_aux.shape)}; qkv takes one "
                         f"logit per query head, ({query.shape[1]},)")
    wants_grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
        or (s_aux is not None and s_aux.requires_grad))
    options = {"sinks": s_aux, "attn_mask": mask, "is_causal": causal, "scale": scaling,
               "window": window, "softcap": softcap}
    # qkv.torch.attention differentiates 16-bit inputs in float32 and rounds the output back;
    # without gradients the plain call skips the autograd bookkeeping and the lse.
    # Attention dropout (the model passes its config's rate in training mode, 0 in eval):
    # the seed from torch's default generator, so torch.manual_seed reproduces a run.
    if wants_grad:
        out = _attention_with_grad(query, key, value, dropout_p=dropout, **options)
    else:
        out = _attention(query, key, value, **options, **_torch_dropout(dropout))
    if out.dtype != query.dtype:
        out = out.to(query.dtype)
    # The model reshapes this to [B, Nq, H·Dv]: one copy here, as sdpa's, and a view there.
    return out.transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, attention_mask)

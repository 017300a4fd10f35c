"""The torch.autograd.Function behind qkv.torch: qkv's forward (its lse kept) and qkv's fused
backward. Imported by qkv.torch only (it imports torch)."""

import torch
from torch.autograd.function import once_differentiable

from . import _qkv
from ._arrays import dtype_name
from ._attention import attention as _attention, attention_backward as _attention_backward

_SIXTEEN_BIT = {torch.bfloat16, torch.float16}
_FLOAT16_NAMES = {"float16", "f16", "fp16", "half"}


def _shared_dtype(q, k, v):
    """The dtype q, k and v all have, or None when they differ."""
    return q.dtype if q.dtype == k.dtype == v.dtype else None


def _backward_dtype(q, k, v, dtype):
    """The dtype the backward computes in: the forward's (a bfloat16 forward has the bfloat16
    backward), except that a float16 forward (asked for, or the default for float16 inputs) is
    differentiated in float32: qkv has no float16 backward; float32 reads the float16 inputs in
    place, as they are, and the gradients are rounded to the inputs' dtype once at the end."""
    name = dtype_name(dtype)
    if name is None:
        shared = _shared_dtype(q, k, v)
        name = dtype_name(shared) if shared in _SIXTEEN_BIT else None
    return "float32" if name in _FLOAT16_NAMES else dtype


def autocast_inputs(*tensors):
    """The tensors as torch.autocast("cpu", dtype=...) would hand them to a matmul: float32 ones
    cast to the autocast dtype (bfloat16 or float16) while CPU autocast is on, the others as
    they are. The cast is an autograd op, so gradients reach the float32 tensors in float32."""
    if not torch.is_autocast_enabled("cpu"):
        return tensors
    low = torch.get_autocast_dtype("cpu")
    if low not in _SIXTEEN_BIT:
        return tensors
    return tuple(t.to(low) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t
                 for t in tensors)


def torch_dropout(dropout_p, generator=None):
    """The dropout options of a torch-facing call: {} without dropout, else dropout_p and a seed
    drawn from torch's generator (torch.default_generator unless one is given), one draw per
    call, so that torch.manual_seed reproduces a run as it does for torch's own dropout. The
    Function keeps the seed for its backward, which draws the same mask again."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        from . import _qkv
        raise _qkv.Error(f"dropout_p: must be a number in [0, 1), got {dropout_p!r}")
    if dropout_p == 0:
        return {}
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
    return {"dropout_p": float(dropout_p), "seed": seed}


class Attention(torch.autograd.Function):
    """qkv.attention forward (with its lse kept), qkv.attention_backward backward.

    apply(q, k, v, sinks, options): options are qkv.attention's keyword arguments besides the
    tensors that take gradients. A 16-bit output (q, k, v all bfloat16 or all float16) is
    rounded from the float32 output, which is kept for the backward (D_i = Σ dO·O in float32)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, options):
        # Nothing is recorded inside forward; the detach says so to the plain functions, which
        # refuse tensors that require grad.
        q, k, v = q.detach(), k.detach(), v.detach()
        sinks = sinks.detach() if sinks is not None else None
        shared = _shared_dtype(q, k, v)
        out_dtype = "float32" if shared in _SIXTEEN_BIT else None
        result = _attention(q, k, v, sinks=sinks, return_lse=True, out_dtype=out_dtype, **options)
        ctx.options = dict(options, dtype=_backward_dtype(q, k, v, options.get("dtype")))
        ctx.save_for_backward(q, k, v, sinks, result.out, result.lse)
        return result.out.to(shared) if out_dtype else result.out

    @staticmethod
    def backward(ctx, grad_out):
        # create_graph=True runs the backward with autograd recording, to differentiate the
        # gradients again. qkv's backward is not itself differentiable: its gradients would be
        # constants to autograd, and a gradient penalty through them silently zero. Refused.
        if torch.is_grad_enabled():
            raise _qkv.Error(
                "qkv.torch.attention: has no second derivative (its backward is qkv's fused "
                "kernel, which autograd cannot differentiate); a gradient taken with "
                "create_graph=True through it would be treated as a constant. Use "
                "torch.nn.functional.scaled_dot_product_attention where a double backward "
                "is needed")
        return Attention._backward(ctx, grad_out)

    @staticmethod
    @once_differentiable
    def _backward(ctx, grad_out):
        q, k, v, sinks, out, lse = ctx.saved_tensors
        need_q, need_k, need_v, need_sinks, _ = ctx.needs_input_grad
        if not (need_q or need_k or need_v or need_sinks):
            return None, None, None, None, None
        g = _attention_backward(q, k, v, out, lse, grad_out.contiguous(), sinks=sinks,
                                **ctx.options)

        def grad(tensor, like, needed):
            return tensor.to(like.dtype) if needed else None

        return (grad(g.dq, q, need_q), grad(g.dk, k, need_k), grad(g.dv, v, need_v),
                grad(g.dsinks, sinks, need_sinks) if sinks is not None else None, None)

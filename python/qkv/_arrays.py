"""Inputs as NumPy arrays without copying, and outputs in the kind of array that came in.

In: NumPy arrays as they are, torch tensors and other DLPack producers through
numpy.from_dlpack, anything else through numpy.asarray (__array__). torch.bfloat16, which NumPy
lacks, travels as the pair ("bfloat16", its bits as uint16): the extension reads it as bfloat16
storage in place.

Out: the extension allocates every result as a NumPy array. When any array argument of a call
is a torch tensor, the call hands its results back as torch tensors sharing that memory
(torch.from_numpy: no copy); a bfloat16 result, which the extension cannot hold, is rounded
from the float32 it computed (nearest even), the one copy.

A tensor that requires grad is refused while torch records a graph: plain qkv computes no
gradient, and a silent detach would cut the graph without a word. Under torch.no_grad() or
torch.inference_mode() nothing is recorded, and such a tensor is read like any other.
"""

import sys

import numpy as np

# The differentiable twin of each plain entry point, for the message that refuses a tensor
# that requires grad.
_TWINS = {
    "qkv.attention": "qkv.torch.attention or qkv.torch.scaled_dot_product_attention",
    "qkv.attention_backward": "qkv.torch.attention, whose backward calls it",
    "qkv.MultiHeadAttention": "qkv.torch.MultiheadAttention",
}


def as_input(value, name="input", caller="qkv"):
    """The array qkv reads `value` through (None stays None); `name` is the argument's and
    `caller` the function's, for the qkv.Error a tensor qkv cannot read raises."""
    if value is None or type(value) is np.ndarray:
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        return _from_torch(value, name, caller)
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError):
            pass  # a device or dtype NumPy cannot take through DLPack: try __array__
    return np.asarray(value)


def _from_torch(tensor, name, caller):
    from . import _qkv  # the extension's Error; imported here, as _qkv imports nothing of ours

    torch = sys.modules["torch"]  # loaded: `tensor` is one of its objects
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    check_tensor(tensor, name)
    if tensor.requires_grad:
        if torch.is_grad_enabled():
            twin = _TWINS.get(caller)
            advice = f"use {twin} (or {name}.detach())" if twin else (
                f"pass {name}.detach() or call under torch.no_grad()")
            raise _qkv.Error(f"{name}: requires grad; {caller} does not differentiate — {advice}")
        tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return ("bfloat16", tensor.view(torch.int16).numpy().view(np.uint16))
    try:
        return tensor.numpy()  # shares the tensor's memory
    except RuntimeError:  # a lazily negated or conjugated view: materialise it
        return tensor.resolve_conj().resolve_neg().numpy()


def check_tensor(tensor, name):
    """Raises qkv.Error naming `name` unless the torch tensor is one qkv can read in place: a
    dense (strided) tensor on the CPU."""
    from . import _qkv

    torch = sys.modules["torch"]
    if tensor.is_nested:
        raise _qkv.Error(f"{name}: a nested tensor is not an array qkv reads (pad it: "
                         f"tensor.to_padded_tensor(0.0), and mask the padding)")
    if tensor.layout != torch.strided:
        raise _qkv.Error(f"{name}: a {str(tensor.layout).replace('torch.', '')} tensor is not an "
                         f"array qkv reads (pass tensor.to_dense())")
    if not tensor.is_cpu:
        raise _qkv.Error(f"{name}: qkv computes on the CPU; move the tensor there first "
                         f"(it is on {tensor.device})")


def torch_given(*values):
    """Whether any of `values` is a torch tensor: the rule for handing results back as torch
    tensors. Cheap when torch was never imported."""
    torch = sys.modules.get("torch")
    return torch is not None and any(isinstance(v, torch.Tensor) for v in values)


def all_bfloat16(*values):
    """Whether every one of `values` holds bfloat16 (a torch.bfloat16 tensor or the pair
    as_input makes of one); None values are skipped, and at least one must be given."""
    torch = sys.modules.get("torch")
    given = [v for v in values if v is not None]

    def bf16(v):
        if isinstance(v, tuple):
            return len(v) == 2 and v[0] == "bfloat16"
        return torch is not None and isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16

    return bool(given) and all(bf16(v) for v in given)


def output_dtype(out_dtype, torch_out, bfloat16_inputs):
    """(the out_dtype to ask the extension for, whether to round its output to bfloat16).

    The extension writes float32, float64 or float16. A bfloat16 output — asked for, or the
    default when torch tensors of bfloat16 came in, as torch's outputs follow their inputs — is
    computed as float32 and rounded once here; NumPy has no bfloat16, so only a torch output
    can be one."""
    from . import _qkv

    name = dtype_name(out_dtype)
    if name in ("bfloat16", "bf16"):
        if not torch_out:
            raise _qkv.Error("out_dtype: NumPy has no bfloat16; a bfloat16 output comes back only "
                             "as a torch tensor (pass torch tensors, or out_dtype='float32')")
        return "float32", True
    if name is None and torch_out and bfloat16_inputs:
        return "float32", True
    return name, False


def as_output(array, torch_out, bfloat16=False):
    """`array` (a NumPy array the extension allocated, or None) as the caller gets it: itself,
    or a torch tensor sharing its memory when torch_out, rounded to bfloat16 when asked."""
    if array is None or not torch_out:
        return array
    torch = sys.modules["torch"]
    tensor = torch.from_numpy(array)
    return tensor.to(torch.bfloat16) if bfloat16 else tensor


def dtype_name(dtype):
    """A dtype given as a string, a NumPy dtype or type, or a torch dtype, as a string."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        return np.dtype(dtype).name
    except TypeError:
        return text


def text(value, name):
    """`value` (None stays None) as a str that can cross into C++ as UTF-8: a lone surrogate
    (text decoded with errors="surrogateescape", say) raises qkv.Error naming the argument."""
    from . import _qkv

    if value is None:
        return None
    value = str(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _qkv.Error(f"{name}: holds {value[e.start]!r} at character {e.start}, a lone "
                         f"surrogate, which is not text (it cannot be encoded as UTF-8)") from None
    return value

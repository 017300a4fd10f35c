"""Inputs as NumPy arrays without copying: NumPy arrays as they are, torch tensors and other
DLPack producers through numpy.from_dlpack, anything else through numpy.asarray (__array__).

torch.bfloat16, which NumPy lacks, travels as the pair ("bfloat16", its bits as uint16): the
extension reads it as bfloat16 storage in place.
"""

import sys

import numpy as np


def as_input(value, name="input"):
    """The array qkv reads `value` through (None stays None); `name` is the argument's, for the
    qkv.Error a tensor qkv cannot read raises."""
    if value is None or type(value) is np.ndarray:
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        return _from_torch(value, name)
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError):
            pass  # a device or dtype NumPy cannot take through DLPack: try __array__
    return np.asarray(value)


def _from_torch(tensor, name):
    from . import _qkv  # the extension's Error; imported here, as _qkv imports nothing of ours

    torch = sys.modules["torch"]  # loaded: `tensor` is one of its objects
    if not isinstance(tensor, torch.Tensor):
        return np.asarray(tensor)
    if tensor.layout != torch.strided:
        raise _qkv.Error(f"{name}: a {str(tensor.layout).replace('torch.', '')} tensor is not an "
                         f"array qkv reads (pass tensor.to_dense())")
    if not tensor.is_cpu:
        raise _qkv.Error(f"{name}: qkv computes on the CPU; move the tensor there first "
                         f"(it is on {tensor.device})")
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return ("bfloat16", tensor.view(torch.int16).numpy().view(np.uint16))
    try:
        return tensor.numpy()  # shares the tensor's memory
    except RuntimeError:  # a lazily negated or conjugated view: materialise it
        return tensor.resolve_conj().resolve_neg().numpy()


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

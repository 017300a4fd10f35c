"""qkv.read_npy, qkv.load_safetensors and friends: files in and out."""

__all__ = []

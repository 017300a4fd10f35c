"""qkv.KVCache: decoding against cached keys and values."""

__all__ = []

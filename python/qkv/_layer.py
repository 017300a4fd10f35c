"""qkv.MultiHeadAttention and qkv.linear: the layer in the seed's X·W layout."""

__all__ = []

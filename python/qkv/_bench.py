"""qkv.bench: timing attention in C++, without Python in the loop."""

__all__ = []

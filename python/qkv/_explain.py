"""qkv.explain: the walk-through and the attention page."""

__all__ = []

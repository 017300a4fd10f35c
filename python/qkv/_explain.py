"""qkv.explain: the walk-through and the attention page."""

from . import _qkv
from ._arrays import as_input, text
from ._options import attention_options

Explanation = _qkv.Explanation
Explanation.__module__ = "qkv"

__all__ = ["explain", "Explanation"]

# What only means something for given inputs: the built-in example has its own.
_INPUT_OPTIONS = ("attn_mask", "is_causal", "scale", "window", "softcap", "alibi_slopes", "sinks",
                  "dtype", "query_labels", "key_labels", "title", "batch")


def _labels(labels, name):
    if labels is None:
        return None
    if isinstance(labels, str):
        raise _qkv.Error(f"{name}: expected one label per row (a list of strings), got a string")
    return [text(label, f"{name}[{i}]") for i, label in enumerate(labels)]


def explain(q=None, k=None, v=None, *, attn_mask=None, is_causal=False, scale=None, window=None,
            softcap=None, alibi_slopes=None, sinks=None, dtype=None, threads=None,
            query_labels=None, key_labels=None, title=None, batch=0):
    """The walk-through of query, key and value, for attention(q, k, v, ...).

    Shapes and options as for qkv.attention (a packed batch is refused: explain walks through
    one sequence); `batch` picks the batch element of a 4-D q. query_labels and key_labels name
    the rows (one string per row). With no q, k, v: the built-in example (users' tastes
    against films, then the films attending to each other), which takes no options.

    Returns a qkv.Explanation:
      .text(rows=None, head=None, top=8)  what `qkv explain` prints: the overview and the
                                           walk-through of the most and least focused rows
      .save_html(path)                     the self-contained attention page (atomic write)
      ._repr_html_()                       the page in an iframe, for Jupyter
      .walk_through(head, row)             one row's steps as NumPy arrays (a dict)
      .weights(head)                       the [nq, nk] weights, recomputed from the lse
      .heads, .nq, .nk, .parts
    The explanation is a report, not a tensor operation: its arrays are NumPy arrays whatever
    came in (torch tensors included; one that requires grad raises qkv.Error unless under
    torch.no_grad()). The heavy parts run with the GIL released.
    """
    given = [name for name, value in (("q", q), ("k", k), ("v", v)) if value is not None]
    if not given:
        values = dict(attn_mask=attn_mask, scale=scale, window=window, softcap=softcap,
                      alibi_slopes=alibi_slopes, sinks=sinks, dtype=dtype,
                      query_labels=query_labels, key_labels=key_labels, title=title)
        values = {name: value for name, value in values.items() if value is not None}
        if is_causal:
            values["is_causal"] = is_causal
        if batch != 0:
            values["batch"] = batch
        for name in _INPUT_OPTIONS:
            if name in values:
                raise _qkv.Error(f"{name}: applies to given q, k, v; the built-in example has "
                                 f"its own")
        return _qkv.builtin_examples()
    if len(given) < 3:
        missing = next(name for name in ("q", "k", "v") if name not in given)
        raise _qkv.Error(f"{missing}: is needed: q, k and v go together")
    caller = "qkv.explain"
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, threads=threads, caller=caller)
    return _qkv.explain_attention(as_input(q, "q", caller), as_input(k, "k", caller),
                                  as_input(v, "v", caller), options,
                                  _labels(query_labels, "query_labels"),
                                  _labels(key_labels, "key_labels"), text(title, "title"),
                                  int(batch))


def explain_layer(layer, x, memory, options, query_labels, key_labels, title, batch):
    """MultiHeadAttention.explain's call (python/qkv/_layer.py)."""
    caller = "qkv.MultiHeadAttention.explain"
    return _qkv.explain_layer(as_input(x, "x", caller), as_input(memory, "memory", caller),
                              layer._weights,
                              layer.heads, layer.kv_heads, options,
                              _labels(query_labels, "query_labels"),
                              _labels(key_labels, "key_labels"), text(title, "title"),
                              int(batch))

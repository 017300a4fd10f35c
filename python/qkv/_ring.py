"""qkv.ring_attention: attention across the processes of an MPI communicator (mpi4py)."""

from . import _qkv
from ._arrays import as_input, as_output, torch_given
from ._attention import AttentionGradients, AttentionResult
from ._options import attention_options

__all__ = ["ring_attention", "ring_attention_backward", "ring_rows", "ring_layout",
           "mpi_available"]


def mpi_available():
    """Whether this build of qkv has MPI (ring attention)."""
    return _qkv.mpi_available()


def ring_layout(is_causal=False, window=None):
    """The layout qkv's CLI uses: "zigzag" under is_causal or a window (every rank then does
    the same work), else "contiguous"."""
    return "zigzag" if is_causal or window is not None else "contiguous"


def ring_rows(n, ranks, rank, layout="contiguous"):
    """The global rows [(first, last), ...] rank `rank` of `ranks` holds of a sequence of n rows,
    in local order. "contiguous": rows [rank·n/P, (rank+1)·n/P); "zigzag": n cut into 2P
    chunks, the rank holding chunks rank and 2P-1-rank. Empty ranges are left out."""
    return _qkv.ring_rows(int(n), int(ranks), int(rank), str(layout))


def _ring_of(comm, layout, is_causal, window):
    """The communicator (COMM_WORLD when None) and the layout (ring_layout's when None)."""
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    return comm, ring_layout(is_causal, window) if layout is None else layout


def ring_attention(q, k, v, comm=None, attn_mask=None, is_causal=False, scale=None, window=None,
                   softcap=None, alibi_slopes=None, sinks=None, dtype=None, return_lse=False,
                   threads=None, *, layout=None, out_dtype=None, kernel=None):
    """qkv.attention over the ranks of `comm` (an mpi4py communicator; COMM_WORLD by default).

    Collective: every rank calls it with its own rows of one sequence (q [.., H, n_local, D],
    k [.., Hkv, n_local, D], v [.., Hkv, n_local, Dv], the rows ring_rows(n, comm.size,
    comm.rank, layout) gives) and gets its rows of the output (and of the lse with
    return_lse). layout: "contiguous" or "zigzag"; default ring_layout(is_causal, window).
    The keyword arguments mean what they mean for qkv.attention; attn_mask covers this rank's
    query rows and every key ([.., n_local, Nk] after broadcasting). The weights and packed
    batches are not offered. Torch tensors in give torch tensors out, as for qkv.attention
    (out_dtype bfloat16 is not offered here). An error on any rank raises the same qkv.Error on
    every rank, naming the rank.
    """
    caller = "qkv.ring_attention"
    comm, layout = _ring_of(comm, layout, is_causal, window)
    torch_out = torch_given(q, k, v, attn_mask, alibi_slopes, sinks)
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, out_dtype, return_lse, False, threads, None, None,
                                kernel, None, caller=caller)
    out, lse, _, _, _, _ = _qkv.ring_attention(as_input(q, "q", caller), as_input(k, "k", caller),
                                               as_input(v, "v", caller), options, comm.py2f(),
                                               layout)
    if return_lse:
        return AttentionResult(as_output(out, torch_out), as_output(lse, torch_out), None)
    return as_output(out, torch_out)


def ring_attention_backward(q, k, v, out, lse, grad_out, comm=None, attn_mask=None,
                            is_causal=False, scale=None, window=None, softcap=None,
                            alibi_slopes=None, sinks=None, dtype=None, threads=None, *,
                            layout=None, kernel=None):
    """qkv.attention_backward over the ranks of `comm` (an mpi4py communicator; COMM_WORLD by
    default): the gradients of L = sum(out * grad_out) for the problem qkv.ring_attention
    spreads over the ranks.

    Collective: every rank passes its rows of q, k, v (as for qkv.ring_attention) and of out,
    lse and grad_out (its query rows: what qkv.ring_attention(..., return_lse=True) returned to
    it, and the output's gradient), with the same options as the forward, and gets its rows of
    the gradients. The K/V blocks travel around the ring with their dK/dV accumulators, which
    come back to their owner after P steps. Returns AttentionGradients(dq, dk, dv, dsinks)
    (torch tensors when any array argument is one, else NumPy arrays): this rank's rows of dq,
    dk and dv, and dsinks (the same on every rank; None without sinks). Gradients are float64
    when the call computes in float64, else float32; a bfloat16 or float16 dtype is refused as
    qkv.attention_backward refuses it. kernel forces a
    tiled backward kernel ("fused_hwy", "unfused_blas", "fused_scalar": they take the whole
    row's softmax statistics, which a block of keys alone does not give).
    Equal to qkv.attention_backward on the whole sequence within the kernels' tolerance and
    bitwise repeatable for a given rank count and thread count. An error on any rank raises
    the same qkv.Error on every rank, naming the rank.
    """
    caller = "qkv.ring_attention_backward"
    comm, layout = _ring_of(comm, layout, is_causal, window)
    torch_out = torch_given(q, k, v, out, lse, grad_out, attn_mask, alibi_slopes, sinks)
    options = attention_options(attn_mask, is_causal, scale, window, softcap, alibi_slopes,
                                sinks, dtype, None, False, False, threads, None, None,
                                kernel, None, caller=caller)
    dq, dk, dv, dsinks, _, _, _ = _qkv.ring_attention_backward(
        as_input(q, "q", caller), as_input(k, "k", caller), as_input(v, "v", caller),
        as_input(out, "out", caller), as_input(lse, "lse", caller),
        as_input(grad_out, "grad_out", caller), options, comm.py2f(), layout)
    return AttentionGradients(*(as_output(g, torch_out) for g in (dq, dk, dv, dsinks)))

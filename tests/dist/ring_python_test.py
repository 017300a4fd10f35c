"""qkv.ring_attention and qkv.ring_attention_backward under mpirun (label `mpi`): run as
    mpirun -np P python3 ring_python_test.py BUILD/python
Every rank slices its rows of the same inputs, calls qkv.ring_attention over COMM_WORLD, then
qkv.ring_attention_backward on what it returned, and rank 0 gathers the rows and compares them
with qkv.attention and qkv.attention_backward on the whole sequence by the oracle's rule
(2e-5 · max(1, max|whole|)); then an error on one rank, and an option that differs on one rank,
must raise the same qkv.Error on every rank, for each; and, when torch imports, torch tensors in
give torch tensors out, bit for bit what NumPy in gives."""
import sys

sys.path.insert(0, sys.argv[1])

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import qkv  # noqa: E402

comm = MPI.COMM_WORLD
P, me = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(7)
n, h, hkv, d, dv = 27, 4, 2, 16, 8
q = rng.standard_normal((h, n, d)).astype(np.float32)
k = rng.standard_normal((hkv, n, d)).astype(np.float32)
v = rng.standard_normal((hkv, n, dv)).astype(np.float32)
do = rng.standard_normal((h, n, dv)).astype(np.float32)
sinks = rng.standard_normal(h).astype(np.float32)
failed = False
for kwargs in ({"is_causal": True, "sinks": sinks, "alibi_slopes": True},
               {"window": (4, 1), "softcap": 5.0}, {},
               {"is_causal": True, "attn_mask": rng.random((h, n, n)) < 0.7}):
    layout = qkv.ring_layout(kwargs.get("is_causal", False), kwargs.get("window"))
    rows = qkv.ring_rows(n, P, me, layout)
    mine = lambda x: np.ascontiguousarray(np.concatenate([x[:, a:b] for a, b in rows], axis=1))
    local = dict(kwargs)
    if "attn_mask" in kwargs:  # this rank's query rows, every key
        local["attn_mask"] = mine(kwargs["attn_mask"])
    res = qkv.ring_attention(mine(q), mine(k), mine(v), return_lse=True, **local)
    g = qkv.ring_attention_backward(mine(q), mine(k), mine(v), res.out, res.lse, mine(do),
                                    **local)
    parts = (res.out, res.lse, g.dq, g.dk, g.dv)
    gathered = comm.gather((rows, parts), root=0)
    if me == 0:
        whole = [np.zeros((h, n, dv), np.float32), np.zeros((h, n), np.float32),
                 np.zeros((h, n, d), np.float32), np.zeros((hkv, n, d), np.float32),
                 np.zeros((hkv, n, dv), np.float32)]
        for rws, mine_parts in gathered:
            at = 0
            for a, b in rws:
                for w, part in zip(whole, mine_parts):
                    w[:, a:b] = part[:, at:at + b - a]
                at += b - a
        want = qkv.attention(q, k, v, return_lse=True, **kwargs)
        grads = qkv.attention_backward(q, k, v, want.out, want.lse, do, **kwargs)
        checks = list(zip(("out", "lse", "dq", "dk", "dv"), whole,
                          (want.out, want.lse, grads.dq, grads.dk, grads.dv)))
        if "sinks" in kwargs:
            checks.append(("dsinks", g.dsinks, grads.dsinks))
        for name, got, exp in checks:
            fin = np.isfinite(exp)  # a fully masked row's lse is -inf on both sides
            err = np.max(np.abs(got[fin] - exp[fin]), initial=0.0)
            tol = 2e-5 * max(1.0, np.max(np.abs(exp[fin]), initial=0.0))
            if not (err <= tol and np.array_equal(got[~fin], exp[~fin])):
                print("FAIL", list(kwargs), name, err, tol)
                failed = True

    if g.dsinks is not None:  # the same on every rank
        every = comm.allgather(g.dsinks.tobytes())
        if len(set(every)) != 1:
            print("FAIL rank", me, "dsinks differ between ranks")
            failed = True

# An error on the last rank only: every rank raises it, naming that rank.
bad = np.zeros((h, 1, d + 1), np.float32) if me == P - 1 else np.zeros((h, 1, d), np.float32)
try:
    qkv.ring_attention(bad, np.zeros((hkv, 1, d), np.float32), np.zeros((hkv, 1, dv), np.float32))
    print("FAIL rank", me, "no error")
    failed = True
except qkv.Error as e:
    if ("rank %d" % (P - 1)) not in str(e):
        print("FAIL rank", me, "error", e)
        failed = True

# The backward: dO of another shape on the first rank only; every rank raises, naming rank 0.
x = np.zeros((h, 1, d), np.float32)
kv, vv = np.zeros((hkv, 1, d), np.float32), np.zeros((hkv, 1, dv), np.float32)
o, lse = np.zeros((h, 1, dv), np.float32), np.zeros((h, 1), np.float32)
dout = np.zeros((h, 1, dv + 1) if me == 0 else (h, 1, dv), np.float32)
try:
    qkv.ring_attention_backward(x, kv, vv, o, lse, dout)
    print("FAIL rank", me, "no backward error")
    failed = True
except qkv.Error as e:
    if "rank 0" not in str(e) or "grad_out" not in str(e):
        print("FAIL rank", me, "backward error", e)
        failed = True

# Options that differ between ranks (issue 37, item 3): the ring agrees on them before it
# computes, so every rank raises the same error naming the last rank and the option (before,
# is_causal on one rank gave a wrong answer and no error).
qs, ks, vs = (mine(t) for t in (q, k, v))
for name, kwargs in (("causal", {"is_causal": me == P - 1}),
                     ("softcap", {"softcap": 5.0 if me == P - 1 else 4.0}),
                     ("sinks", {"sinks": sinks + (me == P - 1)})):
    for entry in ("forward", "backward"):
        try:
            if entry == "forward":
                qkv.ring_attention(qs, ks, vs, **kwargs)
            else:
                qkv.ring_attention_backward(qs, ks, vs, res.out, res.lse, mine(do), **kwargs)
            print("FAIL rank", me, entry, name, "differs: no error")
            failed = True
        except qkv.Error as e:
            if ("rank %d: %s differs from rank 0's" % (P - 1, name)) not in str(e):
                print("FAIL rank", me, entry, name, "differs: error", e)
                failed = True

# Torch in, torch out: the same calls on torch tensors hand back torch tensors holding the same
# bits as the NumPy calls' arrays.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    rows = qkv.ring_rows(n, P, me, "contiguous")
    mine = lambda x: np.ascontiguousarray(np.concatenate([x[:, a:b] for a, b in rows], axis=1))
    arrays = [mine(x) for x in (q, k, v, do)]
    tensors = [torch.from_numpy(a) for a in arrays]
    plain = qkv.ring_attention(*arrays[:3], return_lse=True)
    res = qkv.ring_attention(*tensors[:3], return_lse=True)
    plain_g = qkv.ring_attention_backward(*arrays[:3], plain.out, plain.lse, arrays[3])
    g = qkv.ring_attention_backward(*tensors[:3], res.out, res.lse, tensors[3])
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"),
                               (res.out, res.lse, g.dq, g.dk, g.dv),
                               (plain.out, plain.lse, plain_g.dq, plain_g.dk, plain_g.dv)):
        if type(got) is not torch.Tensor or not np.array_equal(got.numpy(), want):
            print("FAIL rank", me, "torch in:", name, type(got).__name__)
            failed = True

failed = comm.allreduce(failed, op=MPI.LOR)
if me == 0:
    print("FAIL" if failed else "ok", "qkv.ring_attention and its backward on", P, "ranks")
sys.exit(1 if failed else 0)

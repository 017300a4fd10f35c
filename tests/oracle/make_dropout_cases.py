#!/usr/bin/env python3
"""Writes the oracle's dropout cases (tests/oracle/cases/v2/drop_*): attention and the layer with
--dropout, forward and gradients, computed in NumPy float64 from docs/interface.md ("Dropout")
with the mask drawn by a Philox4x32-10 written here from its definition (Salmon, Moraes, Dror
and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11), in plain Python integers and
checked against Random123's known-answer vectors (kat_vectors) before anything is written. It
imports nothing of qkv: the cases hold qkv to the contract, not to itself.

usage: make_dropout_cases.py [--out DIR]   (default: the cases/v2 folder beside this file)
       make_dropout_cases.py --check         (writes them to a scratch folder and compares them
                                              byte for byte with the tree's: ctest's
                                              oracle.dropout_cases)

Each analytic gradient is checked here against central finite differences of the float64
forward with the mask held fixed (the seed fixes it, so the function is differentiable).
Rerunning writes the same files (the inputs come from a seeded NumPy generator).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MASK32 = 0xFFFFFFFF

# Philox4x32's round constants: the multipliers and the key's Weyl increments (SC'11, table 2).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32_10(counter, key):
    """Ten rounds on a counter of four 32-bit words with a key of two: each round multiplies
    words 0 and 2 (64-bit products), and the key is bumped by the Weyl constants between
    rounds."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return c0, c1, c2, c3


# Random123's kat_vectors for philox4x32_10: counter, key, answer.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def threshold(p):
    """t = round(p·2^16) (to nearest, ties to even), at least 1 for p > 0, at most 2^16 - 1."""
    return 0 if p == 0 else min(max(round(p * 65536), 1), 65535)


def keep_factors(p, seed, offset, batches, heads, nq, nk, batch_base=0):
    """z [batches, heads, nq, nk]: 65536 / (65536 - t) where the weight is kept, else 0.

    The contract: weight (b, h, i, j) takes Philox4x32-10 keyed by the seed (low 32 bits, high
    32 bits) with counter (8·⌊j/64⌋ + c, i, b·H + h, offset); key 64·⌊j/64⌋ + 16·u + x takes
    call c = ⌊x/2⌋, word 2·⌊u/2⌋ + x mod 2, its low 16 bits for even u (high for odd u), and is
    kept iff those 16 bits are at least t."""
    t = threshold(p)
    z = np.ones((batches, heads, nq, nk))
    if t == 0:
        return z
    key = (seed & MASK32, seed >> 32)
    scale = 65536.0 / (65536 - t)
    for b in range(batches):
        for h in range(heads):
            for i in range(nq):
                calls = {}
                for j in range(nk):
                    block, x, u = j // 64, j % 16, (j % 64) // 16
                    c = block * 8 + x // 2
                    if c not in calls:
                        counter = (c & MASK32, i, ((batch_base + b) * heads + h) & MASK32,
                                   offset)
                        calls[c] = philox4x32_10(counter, key)
                    word = calls[c][2 * (u // 2) + x % 2]
                    draw = word & 0xFFFF if u % 2 == 0 else word >> 16
                    z[b, h, i, j] = scale if draw >= t else 0.0
    return z


def attention(q, k, v, z, causal, scale=None):
    """[B, H, Nq, D] queries against [B, Hkv, Nk, D] keys: out, weights after dropout, lse."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    nq, nk = s.shape[-2:]
    if causal:  # bottom-right aligned: key j allowed iff j <= i + (Nk - Nq)
        allowed = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
        s = np.where(allowed, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - top)
    w = e / e.sum(-1, keepdims=True)
    lse = (top + np.log(e.sum(-1, keepdims=True)))[..., 0]
    return (w * z) @ v, w * z, lse


def attention_grads(q, k, v, z, causal, dout):
    """dQ, dK, dV of sum(out * dout) from the contract's formulas: dV = (w∘z)ᵀ·dO,
    dS = w∘(z∘(dO·Vᵀ) - D), D_i = Σ_c dO_ic·O_ic; a kv head's dK and dV sum over its group."""
    h, hkv = q.shape[1], k.shape[1]
    group = h // hkv
    scale = 1.0 / np.sqrt(q.shape[-1])
    out, _, _ = attention(q, k, v, z, causal)
    _, w, _ = attention(q, k, v, np.ones_like(z), causal)  # the weights before dropout
    kr, vr = np.repeat(k, group, 1), np.repeat(v, group, 1)
    dv = np.swapaxes(w * z, -1, -2) @ dout
    dp = dout @ np.swapaxes(vr, -1, -2)
    delta = (dout * out).sum(-1, keepdims=True)
    ds = w * (z * dp - delta) * scale
    dq = ds @ kr
    dk = np.swapaxes(ds, -1, -2) @ q

    def per_kv_head(g):
        return g.reshape(g.shape[0], hkv, group, *g.shape[2:]).sum(2)

    return dq, per_kv_head(dk), per_kv_head(dv)


def split_heads(y, heads):
    """[B, N, heads·w] -> [B, heads, N, w]: head h is the h-th block of columns."""
    return np.swapaxes(y.reshape(y.shape[0], y.shape[1], heads, -1), 1, 2)


def join_heads(y):
    return np.swapaxes(y, 1, 2).reshape(y.shape[0], y.shape[2], -1)


def layer(t, heads, kv_heads, z, causal):
    q = split_heads(t["x"] @ t["wq"] + t["bq"], heads)
    k = split_heads(t["x"] @ t["wk"] + t["bk"], kv_heads)
    v = split_heads(t["x"] @ t["wv"] + t["bv"], kv_heads)
    out, _, _ = attention(q, k, v, z, causal)
    return join_heads(out) @ t["wo"] + t["bo"]


def layer_grads(t, heads, kv_heads, z, causal, dy):
    """The layer's chain rule: dConcat = dY·W^Oᵀ, then each head's attention backward, then the
    projections (dW = Xᵀ·dP, db = Σ_rows dP, dX = Σ dP·Wᵀ)."""
    q = split_heads(t["x"] @ t["wq"] + t["bq"], heads)
    k = split_heads(t["x"] @ t["wk"] + t["bk"], kv_heads)
    v = split_heads(t["x"] @ t["wv"] + t["bv"], kv_heads)
    out, _, _ = attention(q, k, v, z, causal)
    concat = join_heads(out)
    dconcat = dy @ t["wo"].T
    dq, dk, dv = attention_grads(q, k, v, z, causal, split_heads(dconcat, heads))
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    x = rows(t["x"])
    g = {"wo": rows(concat).T @ rows(dy), "bo": rows(dy).sum(0)}
    dx = np.zeros_like(x)
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        d = rows(join_heads(d))
        g["w" + name] = x.T @ d
        g["b" + name] = d.sum(0)
        dx += d @ t["w" + name].T
    g["x"] = dx.reshape(t["x"].shape)
    return g


def check_by_finite_differences(loss, arrays, grads, what):
    """Every gradient element against central differences of the float64 loss."""
    for name, a in arrays.items():
        if name not in grads:
            continue
        flat = a.reshape(-1)
        numeric = np.empty(flat.size)
        for e in range(flat.size):
            kept = flat[e]
            flat[e] = kept + 1e-6
            up = loss()
            flat[e] = kept - 1e-6
            down = loss()
            flat[e] = kept
            numeric[e] = (up - down) / 2e-6
        got = grads[name].reshape(-1)
        err = np.abs(got - numeric).max()
        assert err <= 1e-6 * max(1.0, np.abs(numeric).max()), (what, name, err)


class Writer:
    def __init__(self, root):
        self.root = root
        self.names = []

    def case(self, name, cmd, desc, inputs, outputs=None, tol=2e-5, error_mentions=None):
        folder = os.path.join(self.root, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for file, array in inputs.items():
            np.save(os.path.join(folder, file), array)
        with open(os.path.join(folder, "cmd"), "w") as f:
            f.write(cmd + "\n")
        if error_mentions is not None:
            expect = {"kind": "error", "desc": desc, "stderr_mentions_any": error_mentions}
        else:
            os.makedirs(os.path.join(folder, "expected"))
            expect = {"kind": "ok", "desc": desc, "outputs": {}}
            for file, array in outputs.items():
                np.save(os.path.join(folder, "expected", file), np.asarray(array, np.float64))
                expect["outputs"][file] = {"expected": "expected/" + file, "dtype": "<f4",
                                           "tol": tol}
        with open(os.path.join(folder, "expect.json"), "w") as f:
            json.dump(expect, f, indent=1)
            f.write("\n")
        self.names.append(name)


def f32(rng, *shape):
    """Inputs stored as float32; the expected values are computed from those very values."""
    return rng.standard_normal(shape).astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(HERE, "cases", "v2"))
    parser.add_argument("--check", action="store_true",
                        help="compare with the cases in the tree instead of writing them")
    args = parser.parse_args()
    if args.check:
        scratch = tempfile.mkdtemp(prefix="qkv_dropout_cases_")
        try:
            names = write_cases(scratch)
            different = [name for name in names if not same_tree(
                os.path.join(scratch, name), os.path.join(HERE, "cases", "v2", name))]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if different:
            print("differ from what make_dropout_cases.py writes: " + ", ".join(different))
            return 1
        print("%d dropout cases as make_dropout_cases.py writes them" % len(names))
        return 0
    names = write_cases(args.out)
    print("wrote %d cases in %s: %s" % (len(names), args.out, ", ".join(names)))
    return 0


def same_tree(a, b):
    """Both folders hold the same files with the same bytes."""
    def files(root):
        found = {}
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    found[os.path.relpath(path, root)] = f.read()
        return found
    return os.path.isdir(b) and files(a) == files(b)


def write_cases(out_dir):
    """Writes every case into out_dir and returns their names."""
    for counter, key, answer in KNOWN_ANSWERS:
        assert philox4x32_10(counter, key) == answer, (counter, key)
    w = Writer(out_dir)
    rng = np.random.default_rng(20261206)
    wide = lambda a: a.astype(np.float64)  # noqa: E731
    attn = "attention --q q.npy --k k.npy --v v.npy"

    # p = 0: the run without dropout, whatever the seed and offset.
    q, k, v = f32(rng, 3, 21, 8), f32(rng, 3, 21, 8), f32(rng, 3, 21, 6)
    ones = np.ones((1, 3, 21, 21))
    out, weights, lse = attention(wide(q)[None], wide(k)[None], wide(v)[None], ones, True)
    w.case("drop_p0_causal", attn + " --causal --dropout 0 --seed 99 --dropout-offset 4 "
           "--out out.npy --weights w.npy --lse lse.npy",
           "--dropout 0: no dropout, whatever the seed", {"q.npy": q, "k.npy": k, "v.npy": v},
           {"out.npy": out[0], "w.npy": weights[0], "lse.npy": lse[0]})

    # Causal with Nq < Nk (bottom-right), keys across two 64-key blocks, a 64-bit seed.
    seed, offset, p = 0xF00DFACE12345678, 7, 0.2
    q, k, v = f32(rng, 2, 9, 16), f32(rng, 2, 75, 16), f32(rng, 2, 75, 5)
    z = keep_factors(p, seed, offset, 1, 2, 9, 75)
    out, weights, lse = attention(wide(q)[None], wide(k)[None], wide(v)[None], z, True)
    w.case("drop_causal_nq_lt_nk", attn + f" --causal --dropout {p} --seed {seed} "
           f"--dropout-offset {offset} --out out.npy --weights w.npy --lse lse.npy",
           "dropout 0.2, causal bottom-right, 75 keys (two 64-key blocks); lse before dropout",
           {"q.npy": q, "k.npy": k, "v.npy": v},
           {"out.npy": out[0], "w.npy": weights[0], "lse.npy": lse[0]})

    # Grouped-query heads in a batch: (b, h) is b·H + h over the query heads.
    seed, offset, p = 31337, 0, 0.5
    q, k, v = f32(rng, 2, 4, 13, 8), f32(rng, 2, 2, 70, 8), f32(rng, 2, 2, 70, 8)
    z = keep_factors(p, seed, offset, 2, 4, 13, 70)
    out, weights, _ = attention(wide(q), wide(k), wide(v), z, False)
    w.case("drop_gqa_batched", attn + f" --dropout {p} --seed {seed} --out out.npy "
           "--weights w.npy", "dropout 0.5, batch 2, 4 query heads on 2 kv heads",
           {"q.npy": q, "k.npy": k, "v.npy": v}, {"out.npy": out, "w.npy": weights})

    # A packed batch: b is the sequence, rows and keys count within it.
    seed, offset, p = 2**64 - 1, 2**32 - 1, 0.3
    cq, ck = np.array([0, 6, 6, 19, 24]), np.array([0, 6, 10, 23, 90])
    q, k, v = f32(rng, 2, 24, 8), f32(rng, 2, 90, 8), f32(rng, 2, 90, 4)
    out = np.zeros((2, 24, 4))
    for s in range(4):
        rq, rk = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
        nq, nk = cq[s + 1] - cq[s], ck[s + 1] - ck[s]
        if nq == 0:
            continue
        z = keep_factors(p, seed, offset, 1, 2, nq, nk, batch_base=s)
        o, _, _ = attention(wide(q[:, rq])[None], wide(k[:, rk])[None], wide(v[:, rk])[None],
                            z, True)
        out[:, rq] = o[0]
    w.case("drop_packed_causal", attn + " --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy --causal "
           f"--dropout {p} --seed {seed} --dropout-offset {offset} --out out.npy",
           "dropout 0.3 in a packed batch [6, 0, 13, 5] / [6, 4, 13, 67]: b is the sequence",
           {"q.npy": q, "k.npy": k, "v.npy": v, "cq.npy": cq, "ck.npy": ck}, {"out.npy": out})

    # Gradients with dropout: the same mask drawn again.
    seed, offset, p = 424242, 1, 0.25
    q, k, v = f32(rng, 1, 4, 17, 8), f32(rng, 1, 2, 17, 8), f32(rng, 1, 2, 17, 6)
    do = f32(rng, 1, 4, 17, 6)
    z = keep_factors(p, seed, offset, 1, 4, 17, 17)
    a = {"q": wide(q), "k": wide(k), "v": wide(v)}
    out, _, _ = attention(a["q"], a["k"], a["v"], z, True)
    dq, dk, dv = attention_grads(a["q"], a["k"], a["v"], z, True, wide(do))
    check_by_finite_differences(
        lambda: float((attention(a["q"], a["k"], a["v"], z, True)[0] * wide(do)).sum()), a,
        {"q": dq, "k": dk, "v": dv}, "attention")
    w.case("drop_grad_gqa_causal", attn + f" --causal --dropout {p} --seed {seed} "
           f"--dropout-offset {offset} --out out.npy --grad-out do.npy --grad-q dq.npy "
           "--grad-k dk.npy --grad-v dv.npy",
           "dropout 0.25 gradients, GQA, causal: the forward's mask drawn again "
           "(finite-difference checked)",
           {"q.npy": q, "k.npy": k, "v.npy": v, "do.npy": do},
           {"out.npy": out, "dq.npy": dq, "dk.npy": dk, "dv.npy": dv}, tol=5e-5)

    # The layer: head h of batch b draws the mask of (b, h) on the projected heads.
    seed, offset, p = 0x5EED, 2, 0.3
    heads, kv_heads, dk_, dv_, d, n, d_out = 4, 2, 4, 3, 10, 14, 6
    t32 = {"x": f32(rng, 2, n, d), "wq": f32(rng, d, heads * dk_),
           "wk": f32(rng, d, kv_heads * dk_), "wv": f32(rng, d, kv_heads * dv_),
           "wo": f32(rng, heads * dv_, d_out), "bq": f32(rng, heads * dk_),
           "bk": f32(rng, kv_heads * dk_), "bv": f32(rng, kv_heads * dv_), "bo": f32(rng, d_out)}
    dy = f32(rng, 2, n, d_out)
    t = {name: wide(a) for name, a in t32.items()}
    z = keep_factors(p, seed, offset, 2, heads, n, n)
    out = layer(t, heads, kv_heads, z, True)
    g = layer_grads(t, heads, kv_heads, z, True, wide(dy))
    check_by_finite_differences(
        lambda: float((layer(t, heads, kv_heads, z, True) * wide(dy)).sum()), t, g, "layer")
    names = ("x", "wq", "wk", "wv", "wo", "bq", "bv", "bo")
    w.case("drop_layer_grad_gqa_causal",
           "layer --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --bq bq.npy "
           "--bk bk.npy --bv bv.npy --bo bo.npy --heads 4 --kv-heads 2 --causal "
           f"--dropout {p} --seed {seed} --dropout-offset {offset} --out out.npy "
           "--grad-out dy.npy " + " ".join(f"--grad-{n_} g_{n_}.npy" for n_ in names),
           "layer with dropout 0.3, GQA, causal, biases, W^O: forward and gradients "
           "(finite-difference checked)",
           dict({f"{name}.npy": a for name, a in t32.items()}, **{"dy.npy": dy}),
           dict({"out.npy": out}, **{f"g_{n_}.npy": g[n_] for n_ in names}), tol=5e-5)

    # Refusals: a P outside [0, 1) is a usage error naming the flag; nothing is written.
    q, k, v = f32(rng, 4, 8), f32(rng, 4, 8), f32(rng, 4, 8)
    w.case("err2_drop_p_one", attn + " --dropout 1 --out out.npy", "dropout P = 1",
           {"q.npy": q, "k.npy": k, "v.npy": v}, error_mentions=["--dropout"])
    w.case("err2_drop_seed_negative", attn + " --dropout 0.1 --seed -3 --out out.npy",
           "dropout seed -3", {"q.npy": q, "k.npy": k, "v.npy": v}, error_mentions=["--seed"])
    return w.names


if __name__ == "__main__":
    sys.exit(main())

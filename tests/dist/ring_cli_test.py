#!/usr/bin/env python3
"""qkv attention --ring under mpirun against the single-process answer (label `mpi`).

Usage: ring_cli_test.py QKV MPIEXEC [MPIEXEC FLAGS...]

For each case: the inputs written as .npy, `qkv attention` run once in one process, then
`MPIEXEC FLAGS -np P qkv attention --ring` for P = 1, 2, 3, 4, each with --grad-out and every
--grad-* output (the backward over the ring), and `qkv layer --ring` likewise (its gradients
too: dX and the weight and bias gradients); O, the lse and the gradients must match by the
oracle's rule, max|ring - single| <= 2e-5 * max(1, max|single|) (the forward's tolerance; the
oracle's gradient cases allow 5e-5). Then the faults: a bad file or a disagreeing shape on one
rank, refused flags and refused gradients, each ending every rank non-zero with one line on
stderr and no output file.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

TOL = 2e-5


def case_inputs(rng, shape_q, hkv, dv, dtype=np.float32, nk=None):
    *lead, _, n, d = shape_q if len(shape_q) >= 3 else (1, shape_q[0], shape_q[1])
    n = n if nk is None else nk
    q = rng.standard_normal(shape_q).astype(dtype)
    if len(shape_q) == 2:
        k = rng.standard_normal((n, d)).astype(dtype)
        v = rng.standard_normal((n, dv)).astype(dtype)
    else:
        k = rng.standard_normal((*lead, hkv, n, d)).astype(dtype)
        v = rng.standard_normal((*lead, hkv, n, dv)).astype(dtype)
    return q, k, v


# (name, Q shape, Hkv, Dv, flags, dtype[, Nk when it differs from Nq])
CASES = [
    ("causal_nq_below_nk", (2, 13, 8), 1, 8, ["--causal", "--alibi"], np.float32, 21),
    ("causal_gqa", (4, 37, 16), 2, 8, ["--causal"], np.float32),
    ("window_batch", (2, 2, 29, 8), 1, 12, ["--window", "5,2"], np.float32),
    ("modifiers", (4, 23, 16), 2, 16, ["--causal", "--alibi", "--softcap", "3", "--sinks", "S"],
     np.float32),
    ("tiny_n_below_p", (3, 4), 1, 5, [], np.float32),
    ("left_window_alibi", (2, 31, 8), 2, 8, ["--window", "3,-1", "--alibi"], np.float32),
    ("causal_f64", (2, 19, 8), 1, 4, ["--causal"], np.float64),
    # Masks: each rank reads its query rows, every key; MB a bool [H, Nq, Nk] (some rows fully
    # masked), MF a float [1, Nk] whose query axis broadcasts.
    ("bool_mask_causal", (2, 22, 8), 1, 8, ["--causal", "--mask", "MB"], np.float32),
    ("float_mask_rows_broadcast", (2, 17, 8), 2, 8, ["--mask", "MF"], np.float32, 25),
    # More rows per rank than the forward ring's kernel call takes at once (512): a block's
    # partial output is merged chunk by chunk, the mask's rows and the positions following.
    ("chunked_rows_causal_mask", (2, 1100, 8), 1, 8, ["--causal", "--mask", "MB"], np.float32),
    ("chunked_rows_float_mask", (2, 1100, 8), 2, 8, ["--mask", "MF"], np.float32, 700),
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def close(name, got, want):
    scale = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0)))
    same_inf = np.array_equal(np.isinf(got), np.isinf(want)) and np.array_equal(
        got[np.isinf(got)], want[np.isinf(want)])
    fin = np.isfinite(want)
    err = float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))
    if not same_inf or err > TOL * scale:
        raise AssertionError("%s: max abs error %.3e (tolerance %.1e)" % (name, err, TOL * scale))


def main():
    qkv, launcher = os.path.abspath(sys.argv[1]), sys.argv[2:]
    rng = np.random.default_rng(25)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        for name, shape_q, hkv, dv, flags, dtype, *nk in CASES:
            q, k, v = case_inputs(rng, shape_q, hkv, dv, dtype, *nk)
            np.save("q.npy", q)
            np.save("k.npy", k)
            np.save("v.npy", v)
            np.save("do.npy", rng.standard_normal((*q.shape[:-1], dv)).astype(dtype))
            h = shape_q[-3] if len(shape_q) >= 3 else 1
            np.save("s.npy", rng.standard_normal(h).astype(np.float32))
            nq, nkk = q.shape[-2], k.shape[-2]
            np.save("mb.npy", rng.random((h, nq, nkk)) < 0.7)
            mf = rng.standard_normal((1, nkk)).astype(np.float32)
            mf[0, ::5] = -np.inf
            np.save("mf.npy", mf)
            names = {"S": "s.npy", "MB": "mb.npy", "MF": "mf.npy"}
            flags = [names.get(f, f) for f in flags]
            base = ["attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"] + flags
            grads = ["dq", "dk", "dv"] + (["ds"] if "--sinks" in flags else [])
            flag_of = {"dq": "--grad-q", "dk": "--grad-k", "dv": "--grad-v", "ds": "--grad-sinks"}

            def grad_flags(suffix):
                out = ["--grad-out", "do.npy"]
                for g in grads:
                    out += [flag_of[g], "%s_%s.npy" % (g, suffix)]
                return out

            r = run([qkv] + base + ["--out", "o1.npy", "--lse", "l1.npy"] + grad_flags("1"))
            if r.returncode != 0:
                failures.append("%s: single process failed: %s" % (name, r.stderr))
                continue
            want = {"out": np.load("o1.npy"), "lse": np.load("l1.npy")}
            for g in grads:
                want[g] = np.load("%s_1.npy" % g)
            for p in (1, 2, 3, 4):
                out, lse = "o_%d.npy" % p, "l_%d.npy" % p
                r = run(launcher + ["-np", str(p), qkv] + base +
                        ["--ring", "--out", out, "--lse", lse] + grad_flags(str(p)))
                try:
                    if r.returncode != 0:
                        raise AssertionError("exit %d: %s" % (r.returncode, r.stderr.strip()))
                    got = {"out": np.load(out), "lse": np.load(lse)}
                    for g in grads:
                        got[g] = np.load("%s_%d.npy" % (g, p))
                    for key in want:
                        if got[key].shape != want[key].shape:
                            raise AssertionError("%s: shape %s, expected %s" %
                                                 (key, got[key].shape, want[key].shape))
                        close(key, got[key].astype(np.float64), want[key].astype(np.float64))
                except AssertionError as e:
                    failures.append("%s P=%d: %s" % (name, p, e))
            # Bitwise repeatable for a given P, whatever the thread count (two cases: each run
            # costs).
            if name not in ("causal_gqa", "modifiers"):
                print("ok" if not any(f.startswith(name) for f in failures) else "FAIL", name)
                continue
            # On 2 threads per rank (the first run took 1: the default for so little work), so
            # that the bits are also shown not to depend on the thread count.
            r = run(launcher + ["-np", "3", qkv] + base +
                    ["--ring", "--threads", "2", "--out", "again.npy"] + grad_flags("again"))
            if r.returncode != 0 or any(
                    open(a, "rb").read() != open(b, "rb").read()
                    for a, b in [("again.npy", "o_3.npy")] +
                    [("%s_again.npy" % g, "%s_3.npy" % g) for g in grads]):
                failures.append("%s: P=3 on 1 and 2 threads gave different bits" % name)
            print("ok" if not any(f.startswith(name) for f in failures) else "FAIL", name)

        container_problems = containers(qkv, launcher, rng)
        print("FAIL" if container_problems else "ok", "containers")
        failures += container_problems
        wide_problems = wide_range(qkv, launcher, rng)
        print("FAIL" if wide_problems else "ok", "wide range")
        failures += wide_problems
        layer_problems = layer(qkv, launcher, rng)
        print("FAIL" if layer_problems else "ok", "layer --ring")
        failures += layer_problems
        fault_problems = faults(qkv, launcher, rng)
        print("FAIL" if fault_problems else "ok", "faults")
        failures += fault_problems
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


def write_safetensors(path, tensors):
    """A safetensors file of float32 arrays, laid out as the format says."""
    import json
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        blob = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def containers(qkv, launcher, rng):
    """Q from a safetensors file, K from a stored .npz member (np.savez), V, a bool mask and DO
    from deflated members (np.savez_compressed): each rank reads only its rows, and the answer
    (O, the lse, dK) is the single-process one."""
    problems = []
    q, k, v = case_inputs(rng, (2, 2, 27, 8), 1, 12)
    mask = rng.random((2, 27, 27)) < 0.6
    write_safetensors("in.safetensors", {"other": np.ones((3, 5), np.float32), "q": q})
    np.savez("stored.npz", first=np.zeros((4, 4), np.float32), k=k)
    grad_out = rng.standard_normal(q.shape[:-1] + (12,)).astype(np.float32)
    np.savez_compressed("deflated.npz", v=v, mask=mask, do=grad_out)
    base = ["attention", "--q", "in.safetensors:q", "--k", "stored.npz:k", "--v", "deflated.npz:v",
            "--mask", "deflated.npz:mask", "--causal", "--grad-out", "deflated.npz:do"]
    r = run([qkv] + base + ["--out", "c1.npy", "--lse", "cl1.npy", "--grad-k", "ck1.npy"])
    if r.returncode != 0:
        return ["containers: single process failed: %s" % r.stderr.strip()]
    want_o, want_l, want_dk = np.load("c1.npy"), np.load("cl1.npy"), np.load("ck1.npy")
    for p in (2, 3):
        r = run(launcher + ["-np", str(p), qkv] + base + ["--ring", "--out", "c.npy", "--lse", "cl.npy",
                                                         "--grad-k", "ck.npy"])
        try:
            if r.returncode != 0:
                raise AssertionError("exit %d: %s" % (r.returncode, r.stderr.strip()))
            close("out", np.load("c.npy").astype(np.float64), want_o.astype(np.float64))
            close("lse", np.load("cl.npy").astype(np.float64), want_l.astype(np.float64))
            close("dK", np.load("ck.npy").astype(np.float64), want_dk.astype(np.float64))
        except AssertionError as e:
            problems.append("containers P=%d: %s" % (p, e))
    return problems


def wide_range(qkv, launcher, rng):
    """Calls the float32 kernels decline for their range, which one process gives to the
    reference kernel and the ring computes in float64 on every rank: scores beyond float32's
    range (|Q|, |K| ~ 1e19; the forward: O and the lse; the backward: dQ, dK, dV, which the
    ring refused while it weighed from the saved lse), and gradient sums beyond it (|dO| ~
    1e36; the backward). Each must match one process's for P = 2 and 3."""
    problems = []
    np.save("big_q.npy", (3e18 * rng.standard_normal((2, 13, 8))).astype(np.float32))
    np.save("big_k.npy", (3e18 * rng.standard_normal((1, 13, 8))).astype(np.float32))
    np.save("small_q.npy", rng.standard_normal((2, 13, 8)).astype(np.float32))
    np.save("small_k.npy", rng.standard_normal((1, 13, 8)).astype(np.float32))
    np.save("big_v.npy", rng.standard_normal((1, 13, 8)).astype(np.float32))
    np.save("big_do.npy", (1e36 * rng.standard_normal((2, 13, 8))).astype(np.float32))
    np.save("small_do.npy", rng.standard_normal((2, 13, 8)).astype(np.float32))
    cases = (("scores", ["--q", "big_q.npy", "--k", "big_k.npy"], ("o", "l"),
              ("--out", "--lse")),
             ("scores with gradients",
              ["--q", "big_q.npy", "--k", "big_k.npy", "--grad-out", "small_do.npy"],
              ("o", "dq", "dk", "dv"), ("--out", "--grad-q", "--grad-k", "--grad-v")),
             ("gradients", ["--q", "small_q.npy", "--k", "small_k.npy", "--grad-out", "big_do.npy"],
              ("o", "dq", "dk", "dv"), ("--out", "--grad-q", "--grad-k", "--grad-v")))
    for what, inputs, keys, flags in cases:
        base = ["attention", "--v", "big_v.npy", "--causal"] + inputs

        def outputs(suffix):
            return [x for f, key in zip(flags, keys) for x in (f, "big_%s_%s.npy" % (key, suffix))]

        r = run([qkv] + base + outputs("1"))
        if r.returncode != 0:
            problems.append("wide %s: single process failed: %s" % (what, r.stderr.strip()))
            continue
        want = {key: np.load("big_%s_1.npy" % key).astype(np.float64) for key in keys}
        for p in (2, 3):
            r = run(launcher + ["-np", str(p), qkv] + base + ["--ring"] + outputs(str(p)))
            try:
                if r.returncode != 0:
                    raise AssertionError("exit %d: %s" % (r.returncode, r.stderr.strip()))
                for key in keys:
                    close(key, np.load("big_%s_%d.npy" % (key, p)).astype(np.float64), want[key])
            except AssertionError as e:
                problems.append("wide %s P=%d: %s" % (what, p, e))
    for name in os.listdir("."):
        if name.startswith(("big_", "small_")):
            os.remove(name)
    return problems


def qkv_lines(stderr):
    """stderr without the launcher's own report of a non-zero status: OpenMPI 5's mpirun
    (Debian 13) prints it between two lines of dashes and has no -q to silence it, as 4's has,
    and its PMIx server may add a line of its own ("[host:pid] PMIX ERROR: ...") as it ends."""
    lines, in_report = [], False
    for line in stderr.strip().splitlines():
        if line.startswith("-----"):
            in_report = not in_report
        elif not in_report and not re.match(r"\[[^]]*\] PMIX ERROR", line):
            lines.append(line)
    return lines


def one_line_failure(r, what, expect_in, status=None):
    problems = []
    lines = qkv_lines(r.stderr)
    if r.returncode == 0 or (status is not None and r.returncode != status):
        problems.append("%s: exit status %d" % (what, r.returncode))
    if len(lines) != 1 or expect_in not in lines[0]:
        problems.append("%s: stderr %r, expected one line with %r" % (what, r.stderr, expect_in))
    if os.path.exists("fault_out.npy") or any(f.startswith(".") or "tmp" in f for f in os.listdir(".")):
        problems.append("%s: an output or temporary file was left: %s" % (what, os.listdir(".")))
    return problems


LAYER_GRADS = ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]


def layer_grad_flags(suffix, dy="dy.npy"):
    out = ["--grad-out", dy]
    for g in LAYER_GRADS:
        out += ["--grad-" + g, "d%s_%s.npy" % (g, suffix)]
    return out


def layer(qkv, launcher, rng):
    """qkv layer --ring for P = 1..4 against one process (X of 29 rows: no P divides it; GQA,
    W^O and every bias), with --grad-out and every --grad-* output (the backward over the ring:
    dX gathered, the weight and bias gradients summed over the ranks), causal, windowed and
    neither (with sinks); the gradients bitwise the same on 1 and 2 threads per rank at P = 3.
    Then a projection that fails on one rank only (X of another width there: the rank never
    reaches the ring), a DY of the wrong shape, a --max-memory every rank's part passes, and the
    flags --ring refuses."""
    problems = []
    x = rng.standard_normal((2, 29, 12)).astype(np.float32)
    np.save("x.npy", x)
    np.save("x_wide.npy", rng.standard_normal((2, 29, 13)).astype(np.float32))
    for name, shape in (("wq", (12, 16)), ("wk", (12, 8)), ("wv", (12, 12)), ("wo", (24, 10))):
        np.save(name + ".npy", (0.3 * rng.standard_normal(shape)).astype(np.float32))
    for name, width in (("bq", 16), ("bk", 8), ("bv", 12), ("bo", 10)):
        np.save(name + ".npy", rng.standard_normal(width).astype(np.float32))
    np.save("dy.npy", rng.standard_normal((2, 29, 10)).astype(np.float32))
    np.save("dy_narrow.npy", rng.standard_normal((2, 29, 9)).astype(np.float32))
    np.save("s_layer.npy", rng.standard_normal(4).astype(np.float32))
    weights = ["--wq", "wq.npy", "--wk", "wk.npy", "--wv", "wv.npy", "--wo", "wo.npy",
               "--bq", "bq.npy", "--bk", "bk.npy", "--bv", "bv.npy", "--bo", "bo.npy",
               "--heads", "4", "--kv-heads", "2"]
    for flags in (["--causal", "--alibi"], ["--window", "4,2", "--softcap", "3"],
                  ["--sinks", "s_layer.npy"]):
        base = ["layer", "--x", "x.npy"] + weights + flags
        r = run([qkv] + base + ["--out", "y1.npy", "--lse", "yl1.npy"] + layer_grad_flags("1"))
        if r.returncode != 0:
            problems.append("layer %s: single process failed: %s" % (flags, r.stderr))
            continue
        want = {"out": np.load("y1.npy"), "lse": np.load("yl1.npy")}
        for g in LAYER_GRADS:
            want["d" + g] = np.load("d%s_1.npy" % g)
        for p in (1, 2, 3, 4):
            r = run(launcher + ["-np", str(p), qkv] + base +
                    ["--ring", "--out", "y_%d.npy" % p, "--lse", "yl_%d.npy" % p] +
                    layer_grad_flags(str(p)))
            try:
                if r.returncode != 0:
                    raise AssertionError("exit %d: %s" % (r.returncode, r.stderr.strip()))
                got = {"out": np.load("y_%d.npy" % p), "lse": np.load("yl_%d.npy" % p)}
                for g in LAYER_GRADS:
                    got["d" + g] = np.load("d%s_%d.npy" % (g, p))
                for key in want:
                    if got[key].shape != want[key].shape:
                        raise AssertionError("%s: shape %s, expected %s" %
                                             (key, got[key].shape, want[key].shape))
                    # db^K is zero in exact arithmetic (a shift of every key's score by the same
                    # q·b^K leaves the softmax unchanged): both sides are rounding noise, held to
                    # the rule's absolute floor.
                    close(key, got[key].astype(np.float64), want[key].astype(np.float64))
            except AssertionError as e:
                problems.append("layer %s P=%d: %s" % (flags, p, e))
        if flags[0] != "--causal":
            continue
        # The bits do not depend on the thread count: P = 3 again on 2 threads per rank.
        r = run(launcher + ["-np", "3", qkv] + base +
                ["--ring", "--threads", "2", "--out", "y_again.npy"] + layer_grad_flags("again"))
        if r.returncode != 0 or any(
                open("d%s_again.npy" % g, "rb").read() != open("d%s_3.npy" % g, "rb").read()
                for g in LAYER_GRADS):
            problems.append("layer: P=3 gradients on 1 and 2 threads gave different bits")
    for name in os.listdir("."):
        if name.startswith(("y_", "yl_", "y1", "yl1")) or (
                name.startswith("d") and name.endswith(("_1.npy", "_2.npy", "_3.npy", "_4.npy",
                                                        "_again.npy"))):
            os.remove(name)
    tail = weights + ["--causal", "--out", "fault_out.npy"]
    # An X of another width on rank 1: refused when the ranks compare their files' shapes
    # (ring_agreement_test.py has the other disagreements). An X of the same shape holding NaN
    # on rank 1: its layer fails there alone, after the ranks agreed, before its ring.
    x_nan = np.load("x.npy")
    x_nan[:] = np.nan
    np.save("x_nan.npy", x_nan)
    for other, what, expect in (("x_wide.npy", "an X of another width", "rank 1: --x differs"),
                                ("x_nan.npy", "a projection failing", "rank 1: x_nan.npy")):
        script = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then x=%s; else x=x.npy; fi; '
                  'exec "$0" layer --ring --x "$x" "$@"' % other)
        r = run(launcher + ["-np", "3", "sh", "-c", script, qkv] + tail)
        problems += one_line_failure(r, "layer: %s on rank 1 of 3" % what, expect, 1)
    fault_grads = layer_grad_flags("fault", "dy_narrow.npy")
    r = run(launcher + ["-np", "3", qkv, "layer", "--ring", "--x", "x.npy"] + fault_grads + tail)
    problems += one_line_failure(r, "layer: DY of the wrong shape", "dy_narrow.npy", 1)
    r = run(launcher + ["-np", "2", qkv, "layer", "--ring", "--x", "x.npy", "--max-memory", "1K"] +
            layer_grad_flags("fault") + tail)
    problems += one_line_failure(r, "layer: budget", "rank 0: --max-memory: this rank's part", 1)
    written = [f for f in os.listdir(".") if f.endswith("_fault.npy")]
    if written:
        problems.append("layer: a refused backward wrote %s" % written)
    r = run(launcher + ["-np", "2", qkv, "layer", "--ring", "--x", "x.npy", "--memory", "x.npy",
                        "--weights", "w.npy"] + tail)
    problems += one_line_failure(r, "layer: refused flags", "--memory, --weights", 2)
    return problems


def faults(qkv, launcher, rng):
    problems = []
    q, k, v = case_inputs(rng, (2, 12, 8), 2, 8)
    np.save("q.npy", q)
    np.save("k.npy", k)
    np.save("v.npy", v)
    np.save("q_wide.npy", rng.standard_normal((2, 12, 9)).astype(np.float32))
    with open("bad.npy", "wb") as f:
        f.write(open("q.npy", "rb").read()[:50])
    for name in os.listdir("."):
        if name.startswith(("o_", "l_", "o1", "l1", "again", "dq_", "dk_", "dv_", "ds_")):
            os.remove(name)
    tail = ["--k", "k.npy", "--v", "v.npy", "--causal", "--out", "fault_out.npy"]
    # Rank 2 of 3 reads a truncated file; rank 1 of 2 a Q with another head dimension.
    for p, rank, q_file, expect in ((3, 2, "bad.npy", "rank 2: bad.npy"),
                                    (2, 1, "q_wide.npy", "rank 1:")):
        script = ('if [ "$OMPI_COMM_WORLD_RANK" = %d ]; then q=%s; else q=q.npy; fi; '
                  'exec "$0" attention --ring --q "$q" "$@"' % (rank, q_file))
        r = run(launcher + ["-np", str(p), "sh", "-c", script, qkv] + tail)
        problems += one_line_failure(r, "fault on rank %d of %d" % (rank, p), expect, 1)
    # A budget every rank passes: refused before reading, one line naming the flag, status 1.
    r = run(launcher + ["-np", "2", qkv, "attention", "--ring", "--q", "q.npy", "--max-memory",
                        "1K"] + tail)
    problems += one_line_failure(r, "budget", "rank 0: --max-memory: this rank's part", 1)
    # Flags the ring refuses: one line naming them, exit 2, nothing written.
    r = run(launcher + ["-np", "2", qkv, "attention", "--ring", "--q", "q.npy", "--weights",
                        "w.npy", "--check"] + tail)
    problems += one_line_failure(r, "refused flags", "--weights, --check", 2)
    # Gradients the ring refuses as one process does (exit 1, one line, nothing written): a
    # 16-bit --dtype, a --backward-kernel that is not a tiled one, dO of another shape.
    np.save("do.npy", rng.standard_normal((2, 12, 8)).astype(np.float32))
    np.save("do_short.npy", rng.standard_normal((2, 11, 8)).astype(np.float32))
    grad = ["--grad-q", "dq.npy", "--grad-k", "dk.npy"]
    for extra, expect in ((["--dtype", "bf16", "--grad-out", "do.npy"], "dtype"),
                          (["--grad-out", "do.npy", "--backward-kernel", "reference"],
                           "--backward-kernel"),
                          (["--grad-out", "do_short.npy"], "do_short.npy")):
        r = run(launcher + ["-np", "2", qkv, "attention", "--ring", "--q", "q.npy"] + extra +
                grad + tail)
        problems += one_line_failure(r, "refused gradients " + " ".join(extra), expect, 1)
        for f in ("dq.npy", "dk.npy"):
            if os.path.exists(f):
                problems.append("refused gradients %s: %s was written" % (" ".join(extra), f))
    # A wait limit that is not a number of seconds: refused before the ring, by every rank.
    r = subprocess.run(launcher + ["-x", "QKV_RING_TIMEOUT", "-np", "2", qkv, "attention",
                                   "--ring", "--q", "q.npy"] + tail, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, QKV_RING_TIMEOUT="soon"))
    problems += one_line_failure(r, "QKV_RING_TIMEOUT=soon", "rank 0: QKV_RING_TIMEOUT", 1)
    return problems


if __name__ == "__main__":
    sys.exit(main())

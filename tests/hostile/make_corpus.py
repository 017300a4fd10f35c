#!/usr/bin/env python3
"""Writes the hostile-file corpus: .npy and .safetensors files that qkv must refuse (npy/,
safetensors/), and legal edge cases of the same formats that it must accept (legal/).

Each file is given to `qkv attention` as Q (a safetensors file as FILE:q); the ctest in this
folder checks that every one ends with a non-zero exit status, exactly one stderr line naming
the file, and no output file. The files are committed; run this script (standard library only)
to regenerate them after adding a case.
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(header, data=b"", major=1, minor=0, pad=True, length=None):
    header = header.encode("latin-1") if isinstance(header, str) else header
    preamble = 10 if major == 1 else 12
    if pad:
        while (preamble + len(header) + 1) % 64:
            header += b" "
        header += b"\n"
    n = len(header) if length is None else length
    size = struct.pack("<H", n) if major == 1 else struct.pack("<I", n)
    return b"\x93NUMPY" + bytes([major, minor]) + size + header + data


def hdr(descr="<f4", fortran="False", shape="(2, 4)"):
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


GOOD8 = f32([0.5] * 8)
GOOD16 = struct.pack("<8H", *([0x3800] * 8))  # eight float16 0.5s

NPY = {
    "empty": b"",
    "magic_only": b"\x93NUMPY",
    "truncated_magic": b"\x93NUM",
    "npz_archive": b"PK\x03\x04" + b"\x00" * 60,
    "plain_text": b"this is not an array\n",
    "version_4_0": npy(hdr(), GOOD8, major=4),
    "version_1_1": npy(hdr(), GOOD8, minor=1),
    "header_past_end": npy(hdr(), b"", length=4000, pad=False),
    "header_length_4gib": npy(hdr(), GOOD8, major=2, length=0xFFFFFFFF, pad=False),
    "header_not_a_dict": npy("hello world", GOOD8),
    "missing_descr": npy("{'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "missing_shape": npy("{'descr': '<f4', 'fortran_order': False, }", GOOD8),
    "missing_fortran_order": npy("{'descr': '<f4', 'shape': (2, 4), }", GOOD8),
    "duplicate_key": npy("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "unknown_key": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), 'x': 1, }", GOOD8),
    "float16_truncated": npy(hdr("<f2"), GOOD16[:15]),
    "float16_extra_bytes": npy(hdr("<f2"), GOOD16 + b"\x00\x00"),
    "float16_sized_as_float32": npy(hdr("<f2"), GOOD8),
    "float16_big_endian": npy(hdr(">f2"), GOOD16),
    "float16_native_order": npy(hdr("=f2"), GOOD16),
    "float16_nan": npy(hdr("<f2"), struct.pack("<8H", *([0x3800, 0x7E00] * 4))),
    "float16_inf": npy(hdr("<f2"), struct.pack("<8H", *([0x3800, 0xFC00] * 4))),
    "float16_bytes_overflow": npy(hdr("<f2", shape="(4611686018427387904, 1)"), GOOD16),
    "float16_huge_shape": npy(hdr("<f2", shape="(65536, 65536)"), GOOD16),
    "float16_numel_overflow": npy(hdr("<f2", shape="(4294967296, 4294967296, 4)"), GOOD16),
    "float16_one_byte_short": npy(hdr("<f2"), GOOD16[:-1]),
    "float16_signalling_nan": npy(hdr("<f2"), struct.pack("<8H", *([0x3800, 0x7C01] * 4))),
    "float16_negative_nan": npy(hdr("<f2"), struct.pack("<8H", *([0xFE00] + [0x3800] * 7))),
    "float16_minus_inf_last": npy(hdr("<f2"), struct.pack("<8H", *([0x3800] * 7 + [0xFC00]))),
    "float16_fortran_order": npy(hdr("<f2", fortran="True"), GOOD16),
    "float16_v2_truncated": npy(hdr("<f2"), GOOD16[:9], major=2),
    "float16_as_f2_no_order": npy(hdr("f2"), GOOD16),
    "big_endian": npy(hdr(">f4"), GOOD8),
    "int64": npy(hdr("<i8"), b"\x00" * 64),
    "object_array": npy(hdr("|O"), b"\x00" * 64),
    "unicode_strings": npy(hdr("<U10"), b"\x00" * 320),
    "structured_dtype": npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "fortran_order": npy(hdr(fortran="True"), GOOD8),
    "negative_dim": npy(hdr(shape="(-1, 4)"), GOOD8),
    "numel_overflow": npy(hdr(shape="(1099511627776, 1099511627776)"), GOOD8),
    "bytes_overflow": npy(hdr(shape="(4611686018427387904, 1)"), GOOD8),
    "dim_over_int64": npy(hdr(shape="(99999999999999999999, 4)"), GOOD8),
    "claims_1gib": npy(hdr(shape="(16384, 16384)"), GOOD8),
    "extra_bytes": npy(hdr(), GOOD8 + b"\x00\x00\x00\x00"),
    "truncated_data": npy(hdr(), GOOD8[:17]),
    "shape_not_tuple": npy(hdr(shape="(8)"), GOOD8),
    "shape_float": npy(hdr(shape="(2.5, 4)"), GOOD8),
    "shape_list": npy(hdr(shape="[2, 4]"), GOOD8),
    "unterminated_string": npy("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "escape_in_string": npy("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "nul_in_header": npy("{'descr': '<f4'\x00, 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "high_bytes_in_header": npy(b"{'descr': '<f4\xff\xfe', 'fortran_order': False, 'shape': (2, 4), }", GOOD8),
    "trailing_garbage": npy(hdr() + " garbage", GOOD8),
    "too_many_dims": npy(hdr(shape="(" + "1, " * 65 + ")"), f32([0.5])),
    "bool_byte_2": npy(hdr("|b1"), bytes([1, 0, 2, 1, 0, 1, 1, 0])),
    "bool_as_queries": npy(hdr("|b1"), bytes([1, 0, 1, 1, 0, 1, 1, 0])),
    "nan_values": npy(hdr(), f32([0.5, float("nan")] * 4)),
    "inf_values": npy(hdr(), f32([0.5, float("inf")] * 4)),
    "scalar": npy(hdr(shape="()"), f32([0.5])),
    "one_dim": npy(hdr(shape="(8,)"), GOOD8),
    "five_dims": npy(hdr(shape="(1, 1, 2, 1, 4)"), GOOD8),
    "width_mismatch": npy(hdr(shape="(4, 2)"), GOOD8),
    "zero_width": npy(hdr(shape="(8, 0)"), b""),
    "directory_like_name.npy.bak": npy(hdr(), GOOD8 + b"\x01"),
}


def st(header_obj=None, data=b"", header_text=None, length=None):
    text = header_text if header_text is not None else json.dumps(header_obj, separators=(",", ":"))
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


def entry(dtype="F32", shape=(2, 4), offsets=(0, 32)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


GOOD32 = f32([0.25] * 8)
GOOD_BF16 = struct.pack("<8H", *([0x3E80] * 8))  # eight bfloat16 0.25s

SAFETENSORS = {
    "empty": b"",
    "short_length": b"\x10\x00\x00",
    "huge_header_length": struct.pack("<Q", 1 << 40) + b"{}",
    "max_header_length": struct.pack("<Q", 2**64 - 1) + b"{}",
    "header_past_end": struct.pack("<Q", 4096) + b'{"q":{}}',
    "zero_header_length": struct.pack("<Q", 0),
    "npy_file": npy(hdr(), GOOD8),
    "header_is_array": st(header_text="[1,2,3]"),
    "bad_json": st(header_text='{"q":{"dtype":"F32",'),
    "trailing_garbage": st(header_text='{"q":' + json.dumps(entry()) + "} x", data=GOOD32),
    "nul_then_garbage": st(header_text='{"q":' + json.dumps(entry()) + '}\x00garbage', data=GOOD32),
    "nul_padding": st(header_text='{"q":' + json.dumps(entry()) + '}' + '\x00' * 7, data=GOOD32),
    "newline_after_json": st(header_text='{"q":' + json.dumps(entry()) + '}\n   ', data=GOOD32),
    "second_json_value": st(header_text='{"q":' + json.dumps(entry()) + '} {}', data=GOOD32),
    "invalid_utf8": st(header_text=b'{"q\xff\xfe":' + json.dumps(entry()).encode() + b"}", data=GOOD32),
    "entry_not_object": st({"q": [1, 2]}),
    "entry_null": st({"q": None}),
    "missing_dtype": st({"q": {"shape": [2, 4], "data_offsets": [0, 32]}}, GOOD32),
    "missing_shape": st({"q": {"dtype": "F32", "data_offsets": [0, 32]}}, GOOD32),
    "missing_offsets": st({"q": {"dtype": "F32", "shape": [2, 4]}}, GOOD32),
    "unknown_dtype": st({"q": entry(dtype="F33")}, GOOD32),
    "dtype_number": st({"q": {"dtype": 4, "shape": [2, 4], "data_offsets": [0, 32]}}, GOOD32),
    "negative_dim": st({"q": entry(shape=(-2, 4))}, GOOD32),
    "float_dim": st({"q": entry(shape=(2.5, 4))}, GOOD32),
    "dim_over_uint64": st(header_text='{"q":{"dtype":"F32","shape":[99999999999999999999,4],"data_offsets":[0,32]}}', data=GOOD32),
    "dim_over_int64": st({"q": entry(shape=(2**63, 4))}, GOOD32),
    "three_offsets": st({"q": entry(offsets=(0, 16, 32))}, GOOD32),
    "end_before_begin": st({"q": entry(shape=(0,), offsets=(32, 0))}, GOOD32),
    "gap_before_tensor": st({"q": entry(offsets=(4, 36))}, GOOD32 + b"\x00" * 4),
    "overlapping_tensors": st({"q": entry(), "k": entry(offsets=(16, 48))}, GOOD32 + b"\x00" * 16),
    "size_mismatch": st({"q": entry(offsets=(0, 16))}, GOOD32[:16]),
    "past_end_of_file": st({"q": entry(), "k": entry(offsets=(32, 64))}, GOOD32),
    "bytes_after_last_tensor": st({"q": entry()}, GOOD32 + b"\x00" * 8),
    "numel_overflow": st({"q": entry(shape=(2**32, 2**32, 16))}, GOOD32),
    "duplicate_name": st(header_text='{"q":' + json.dumps(entry()) + ',"q":' + json.dumps(entry(offsets=(32, 64))) + "}", data=GOOD32 * 2),
    "unknown_key": st({"q": dict(entry(), extra=1)}, GOOD32),
    "metadata_nested": st({"__metadata__": {"a": {"b": "c"}}, "q": entry()}, GOOD32),
    "metadata_number": st({"__metadata__": {"a": 1}, "q": entry()}, GOOD32),
    "deep_nesting": st(header_text='{"q":{"shape":' + "[" * 5000 + "]" * 5000 + "}}"),
    "too_many_dims": st({"q": entry(shape=[1] * 65, offsets=(0, 4))}, f32([0.5])),
    "misaligned_f4": st({"q": entry(dtype="F4", shape=(3,), offsets=(0, 1))}, b"\x00"),
    "no_such_tensor": st({"k": entry()}, GOOD32),
    "int64_tensor": st({"q": entry(dtype="I64", offsets=(0, 64))}, b"\x00" * 64),
    "bool_byte_2": st({"q": entry(dtype="BOOL", offsets=(0, 8))}, bytes([1, 0, 2, 1, 0, 1, 1, 0])),
    "f16_sized_as_f32": st({"q": entry(dtype="F16", offsets=(0, 32))}, GOOD32),
    "bf16_past_end_of_file": st({"q": entry(dtype="BF16", offsets=(0, 16)), "k": entry(dtype="BF16", offsets=(16, 32))}, b"\x80\x3f" * 8),
    "f16_nan": st({"q": entry(dtype="F16", offsets=(0, 16))}, struct.pack("<8H", *([0x3C00, 0x7E00] * 4))),
    "bf16_inf": st({"q": entry(dtype="BF16", offsets=(0, 16))}, struct.pack("<8H", *([0x3F80, 0x7F80] * 4))),
    "f32_nan": st({"q": entry()}, f32([0.5, float("nan")] * 4)),
    "bf16_byte_count_short": st({"q": entry(dtype="BF16", offsets=(0, 14))}, GOOD_BF16[:14]),
    "bf16_byte_count_odd": st({"q": entry(dtype="BF16", offsets=(0, 15))}, GOOD_BF16[:15]),
    "f16_byte_count_long": st({"q": entry(dtype="F16", offsets=(0, 18))}, GOOD16 + b"\x00\x00"),
    "bf16_overlapping_offsets": st({"q": entry(dtype="BF16", offsets=(0, 16)), "k": entry(dtype="BF16", offsets=(8, 24))}, GOOD_BF16 + GOOD_BF16[:8]),
    "f16_aliased_offsets": st({"q": entry(dtype="F16", offsets=(0, 16)), "k": entry(dtype="F16", offsets=(0, 16))}, GOOD16),
    "f16_mixed_with_f32_overlap": st({"q": entry(dtype="F16", offsets=(0, 16)), "k": entry(offsets=(8, 40))}, GOOD16 + GOOD32[:24]),
    "bf16_nan_payload": st({"q": entry(dtype="BF16", offsets=(0, 16))}, struct.pack("<8H", *([0x3F80] * 7 + [0x7F81]))),
    "bf16_negative_nan": st({"q": entry(dtype="BF16", offsets=(0, 16))}, struct.pack("<8H", *([0xFFC0] + [0x3F80] * 7))),
    "f16_signalling_nan": st({"q": entry(dtype="F16", offsets=(0, 16))}, struct.pack("<8H", *([0x3C00] * 3 + [0x7C01] + [0x3C00] * 4))),
    "bf16_minus_inf": st({"q": entry(dtype="BF16", offsets=(0, 16))}, struct.pack("<8H", *([0x3F80] * 4 + [0xFF80] + [0x3F80] * 3))),
    "bf16_huge_shape": st({"q": entry(dtype="BF16", shape=(2**31, 2**31), offsets=(0, 16))}, GOOD_BF16),
    "f16_numel_overflow": st({"q": entry(dtype="F16", shape=(2**32, 2**32, 4), offsets=(0, 16))}, GOOD16),
    "bf16_one_dim_queries": st({"q": entry(dtype="BF16", shape=(8,), offsets=(0, 16))}, GOOD_BF16),
    "one_dim_queries": st({"q": entry(shape=(8,))}, GOOD32),
}


# Legal edge cases in the same formats: each must be accepted as Q ([N, 4]; a safetensors file
# as FILE:q) and give an output of N rows. Extremes of the 16-bit types, other format versions.
HALF_EDGES = struct.pack("<8H", 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x8000, 0x3C00, 0x0400, 0x3800)
BF16_EDGES = struct.pack("<8H", 0x0001, 0x007F, 0x4780, 0xC780, 0x8000, 0x3F80, 0x0080, 0x3E80)

LEGAL = {
    "float16_edges.npy": npy(hdr("<f2"), HALF_EDGES),
    "float16_version_2.npy": npy(hdr("<f2"), GOOD16, major=2),
    "float16_version_3.npy": npy(hdr("<f2"), GOOD16, major=3),
    "float16_no_rows.npy": npy(hdr("<f2", shape="(0, 4)")),
    "float16_one_row.npy": npy(hdr("<f2", shape="(1, 4)"), GOOD16[:8]),
    "f16_edges.safetensors": st({"q": entry(dtype="F16", offsets=(0, 16))}, HALF_EDGES),
    "bf16_edges.safetensors": st({"q": entry(dtype="BF16", offsets=(0, 16))}, BF16_EDGES),
    "bf16_after_f32.safetensors": st({"k": entry(), "q": entry(dtype="BF16", offsets=(32, 48))}, GOOD32 + GOOD_BF16),
    "f16_and_bf16_metadata.safetensors": st({"__metadata__": {"format": "pt"}, "q": entry(dtype="F16", offsets=(0, 16)), "r": entry(dtype="BF16", offsets=(16, 32))}, GOOD16 + GOOD_BF16),
}


def main():
    legal = os.path.join(HERE, "legal")
    os.makedirs(legal, exist_ok=True)
    for name in os.listdir(legal):
        if not name.endswith(".npz"):  # make_npz_corpus.py writes those
            os.remove(os.path.join(legal, name))
    for name, data in LEGAL.items():
        with open(os.path.join(legal, name), "wb") as f:
            f.write(data)
    print(f"legal: {len(LEGAL)} files", file=sys.stderr)
    for folder, files, suffix in (("npy", NPY, ".npy"), ("safetensors", SAFETENSORS, ".safetensors")):
        out = os.path.join(HERE, folder)
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):
            os.remove(os.path.join(out, name))
        for name, data in files.items():
            with open(os.path.join(out, name + ("" if name.endswith(".bak") else suffix)), "wb") as f:
                f.write(data)
        print(f"{folder}: {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()

"""qkv.read_npy, read_tensor, load_safetensors and write_npy: round trips, and every file problem
a one-line qkv.FileError (also an OSError) naming the file."""

import json
import os
import pathlib
import struct
import zipfile

import numpy as np
import pytest

import qkv


def write_safetensors(path, tensors):
    """A .safetensors file from {name: (dtype string, shape, raw bytes)}, as the format says."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text + data)


def bf16_bits(values):
    """bfloat16 bits of values that bfloat16 holds exactly (their float32 high halves)."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)
    return (bits >> 16).astype("<u2")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.bool_])
def test_read_npy_keeps_the_dtype(tmp_path, dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    got = qkv.read_npy(tmp_path / "a.npy")  # os.PathLike
    assert got.dtype == a.dtype and np.array_equal(got, a)
    assert np.array_equal(qkv.read_npy(str(tmp_path / "a.npy")), a)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_write_npy_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 0, 2)) if dtype == "float16" else rng.standard_normal((3, 5))
    qkv.write_npy(tmp_path / "out.npy", a, dtype=dtype)
    back = np.load(tmp_path / "out.npy")
    assert back.dtype == np.dtype(dtype)
    assert np.array_equal(back, a.astype(dtype))  # rounded once, nearest even, as NumPy does
    assert np.array_equal(qkv.read_npy(tmp_path / "out.npy"), back)
    assert os.listdir(tmp_path) == ["out.npy"]  # no temporary file left behind


def test_write_npy_default_dtype_and_strided_input(tmp_path):
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    qkv.write_npy(tmp_path / "s.npy", a)
    back = np.load(tmp_path / "s.npy")
    assert back.dtype == np.float32 and np.array_equal(back, a)


def test_write_npy_bfloat16_torch_tensor_as_float32(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, -2.5, 3.0e5], dtype=torch.bfloat16)
    qkv.write_npy(tmp_path / "t.npy", t)
    back = np.load(tmp_path / "t.npy")
    assert back.dtype == np.float32 and np.array_equal(back, t.float().numpy())
    with pytest.raises(qkv.Error, match="^dtype: a .npy file cannot hold bfloat16"):
        qkv.write_npy(tmp_path / "t.npy", t, dtype="bfloat16")


def test_truncated_npy_is_a_file_error(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((100, 10)))
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(raw[:len(raw) - 8])
    with pytest.raises(qkv.FileError) as raised:
        qkv.read_npy(tmp_path / "cut.npy")
    error = raised.value
    assert isinstance(error, OSError) and isinstance(error, qkv.Error)
    assert isinstance(error, ValueError)
    assert str(error).startswith(str(tmp_path / "cut.npy") + ": ")
    assert error.subject == str(tmp_path / "cut.npy") and "\n" not in str(error)


@pytest.mark.parametrize("content", [b"", b"not an npy file at all", b"\x93NUMPY\x01\x00\xff\xff"])
def test_damaged_npy_is_a_file_error(tmp_path, content):
    (tmp_path / "bad.npy").write_bytes(content)
    with pytest.raises(qkv.FileError, match="bad.npy: "):
        qkv.read_npy(tmp_path / "bad.npy")


def test_missing_file_and_bad_paths(tmp_path):
    with pytest.raises(qkv.FileError) as raised:
        qkv.read_npy(tmp_path / "missing.npy")
    assert isinstance(raised.value, OSError)
    assert str(raised.value).startswith(str(tmp_path / "missing.npy"))
    with pytest.raises(qkv.FileError, match="missing.safetensors"):
        qkv.load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(qkv.FileError):
        qkv.write_npy(tmp_path / "no" / "such" / "dir.npy", np.ones(2))
    with pytest.raises(qkv.FileError):
        qkv.write_npy(tmp_path, np.ones(2))  # a directory
    with pytest.raises(qkv.Error, match="^path: expected a str or os.PathLike"):
        qkv.read_npy(3)
    with pytest.raises(qkv.Error, match="^array: dtype int8"):
        qkv.write_npy(tmp_path / "i.npy", np.zeros(3, np.int8))
    assert not (tmp_path / "i.npy").exists()


def test_read_npy_refuses_integers_naming_the_file(tmp_path):
    np.save(tmp_path / "i.npy", np.arange(3))
    with pytest.raises(qkv.FileError, match="i.npy: integer dtype"):
        qkv.read_npy(tmp_path / "i.npy")


def test_safetensors_with_bf16(tmp_path):
    f32 = np.array([[1.5, -2.0], [3.25, 0.0]], np.float32)
    bf = np.array([1.0, -0.5, 3.0 * 2.0 ** 16, 2.0 ** -10], np.float32)
    f16 = np.array([0.1, 2.0], np.float16)
    write_safetensors(tmp_path / "m.safetensors", {
        "w": ("F32", f32.shape, f32.astype("<f4").tobytes()),
        "b": ("BF16", bf.shape, bf16_bits(bf).tobytes()),
        "h": ("F16", f16.shape, f16.astype("<f2").tobytes()),
    })
    tensors = qkv.load_safetensors(tmp_path / "m.safetensors")
    assert sorted(tensors) == ["b", "h", "w"]
    assert tensors["w"].dtype == np.float32 and np.array_equal(tensors["w"], f32)
    assert tensors["b"].dtype == np.float32 and np.array_equal(tensors["b"], bf)
    assert tensors["h"].dtype == np.float16 and np.array_equal(tensors["h"], f16)
    b = qkv.read_tensor(f"{tmp_path / 'm.safetensors'}:b")
    assert b.dtype == np.float32 and np.array_equal(b, bf)
    with pytest.raises(qkv.FileError, match="m.safetensors: has no tensor named .nothere."):
        qkv.read_tensor(f"{tmp_path / 'm.safetensors'}:nothere")


def test_read_tensor_rows_in_every_format(tmp_path):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 3, 9, 4)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "s.npz", first=np.zeros(3, np.float32), a=a)
    np.savez_compressed(tmp_path / "c.npz", a=a)
    write_safetensors(tmp_path / "a.safetensors", {"a": ("F32", a.shape, a.astype("<f4").tobytes())})
    rows = qkv.ring_rows(9, 2, 1, "zigzag")  # [(4, 6), (6, 9)] style pairs: ascending, disjoint
    want = np.concatenate([a[..., f:l, :] for f, l in rows], axis=-2)
    for spec in (tmp_path / "a.npy", f"{tmp_path / 's.npz'}:a", f"{tmp_path / 'c.npz'}:a",
                 f"{tmp_path / 'a.safetensors'}:a"):
        got = qkv.read_tensor(spec, rows=rows)
        assert got.dtype == np.float32 and np.array_equal(got, want), spec
        assert np.array_equal(qkv.read_tensor(spec, rows=[(2, 2)]), a[..., 2:2, :])
        with pytest.raises(qkv.FileError, match="row spans must be ascending"):
            qkv.read_tensor(spec, rows=[(5, 7), (0, 2)])
        with pytest.raises(qkv.FileError, match="cannot read rows .8, 10. of its 9"):
            qkv.read_tensor(spec, rows=[(8, 10)])
    with pytest.raises(TypeError, match="pairs of integers"):
        qkv.read_tensor(tmp_path / "a.npy", rows=[(0.5, 2)])


def test_safetensors_damaged_and_integer(tmp_path):
    write_safetensors(tmp_path / "i.safetensors",
                      {"n": ("I64", (2,), np.arange(2, dtype="<i8").tobytes())})
    with pytest.raises(qkv.FileError, match="i.safetensors:n"):
        qkv.load_safetensors(tmp_path / "i.safetensors")
    raw = (tmp_path / "i.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-3])
    with pytest.raises(qkv.FileError, match="cut.safetensors"):
        qkv.load_safetensors(tmp_path / "cut.safetensors")


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_read_tensor_npy_and_npz(tmp_path):
    a, b = np.arange(6.0).reshape(2, 3), np.ones((4,), np.float32)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "z.npz", a=a, b=b)
    assert np.array_equal(qkv.read_tensor(tmp_path / "a.npy"), a)
    got = qkv.read_tensor(f"{tmp_path / 'z.npz'}:b")
    assert got.dtype == np.float32 and np.array_equal(got, b)
    with pytest.raises(qkv.FileError, match="z.npz: has no array named .c."):
        qkv.read_tensor(f"{tmp_path / 'z.npz'}:c")
    with zipfile.ZipFile(tmp_path / "z.npz", "a") as archive:
        archive.writestr("a.npy", b"again")  # a name given twice
    with pytest.raises(qkv.FileError):
        qkv.read_tensor(f"{tmp_path / 'z.npz'}:a")


def test_paths_with_a_nul_byte_are_refused_not_cut_short(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.ones(3, np.float32))
    for call in (lambda p: qkv.read_npy(p), lambda p: qkv.load_safetensors(p),
                 lambda p: qkv.read_tensor(p), lambda p: qkv.write_npy(p, np.ones(2))):
        with pytest.raises(qkv.Error, match="contains a NUL byte") as raised:
            call(f"{good}\x00tail")
        assert not isinstance(raised.value, qkv.FileError)
    assert sorted(os.listdir(tmp_path)) == ["good.npy"]


def test_paths_that_are_not_utf8_keep_their_bytes(tmp_path):
    name = os.fsencode(tmp_path) + b"/caf\xe9.npy"  # Latin-1, not UTF-8
    qkv.write_npy(name, np.arange(3, dtype=np.float32))
    assert np.array_equal(qkv.read_npy(name), np.arange(3, dtype=np.float32))
    with pytest.raises(qkv.FileError) as raised:
        qkv.read_npy(os.fsencode(tmp_path) + b"/missing-\xff.npy")
    assert os.fsencode(str(raised.value)).startswith(os.fsencode(tmp_path) + b"/missing-\xff.npy")


def test_load_safetensors_reads_many_tensors_in_one_pass(tmp_path):
    # 3000 tensors: the header is parsed once, not once per tensor (which took seconds).
    tensors = {f"t{i}": ("F32", (2,), np.array([i, -i], "<f4").tobytes()) for i in range(3000)}
    write_safetensors(tmp_path / "many.safetensors", tensors)
    loaded = qkv.load_safetensors(tmp_path / "many.safetensors")
    assert len(loaded) == 3000
    assert all(np.array_equal(loaded[f"t{i}"], [i, -i]) for i in range(3000))

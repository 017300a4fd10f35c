#!/usr/bin/env python3
"""Writes the .npz part of the hostile-file corpus: archives qkv must refuse (npz/) and archives
written by NumPy itself that it must accept (legal/*.npz).

Each file is given to `qkv attention` as Q, as FILE.npz:q; the ctest in this folder checks that
every hostile one ends with exit status 1, exactly one stderr line naming the file, and no
output file. tests/io/npz_test.cc checks the message of each at the library level (the table
EXPECTED there names every file written here). The hostile archives are written byte by byte
(struct, zlib) so that each lies in exactly one way; the legal ones by np.savez and
np.savez_compressed. The files are committed; run this script to regenerate them.
"""
import os
import struct
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(shape="(2, 4)", data=None, descr="<f4"):
    """A version 1.0 .npy file, padded as np.save pads it."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    while (10 + len(header) + 1) % 64:
        header += " "
    header += "\n"
    if data is None:
        data = struct.pack("<8f", *[0.5] * 8)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


GOOD = npy()


def deflate(data):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


class Member:
    """One zip entry: what its local header and central entry say, and the bytes stored."""

    def __init__(self, name, payload=GOOD, method=0, stored=None, crc=None, usize=None, csize=None,
                 flags=0, zip64=False):
        self.name = name.encode("utf-8") if isinstance(name, str) else name
        self.stored = stored if stored is not None else (deflate(payload) if method == 8 else payload)
        self.method = method
        self.crc = zlib.crc32(payload) if crc is None else crc
        self.usize = len(payload) if usize is None else usize
        self.csize = len(self.stored) if csize is None else csize
        self.flags = flags
        self.zip64 = zip64
        self.offset = None  # of the local header; set by archive(), or forced
        self.local_csize = None  # a local header that disagrees with the central entry


def local_header(m):
    csize = m.csize if m.local_csize is None else m.local_csize
    if m.zip64:
        extra = struct.pack("<HHQQ", 1, 16, m.usize, csize)
        sizes = (0xFFFFFFFF, 0xFFFFFFFF)
    else:
        extra, sizes = b"", (csize, m.usize)
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if m.zip64 else 20, m.flags, m.method, 0, 0x21,
                       m.crc, sizes[0], sizes[1], len(m.name), len(extra)) + m.name + extra


def central_entry(m):
    if m.zip64:
        extra = struct.pack("<HHQQ", 1, 16, m.usize, m.csize)
        sizes = (0xFFFFFFFF, 0xFFFFFFFF)
    else:
        extra, sizes = b"", (m.csize, m.usize)
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if m.zip64 else 20, 45 if m.zip64 else 20,
                       m.flags, m.method, 0, 0x21, m.crc, sizes[0], sizes[1], len(m.name), len(extra),
                       0, 0, 0, 0, m.offset) + m.name + extra


def archive(members, local_members=None, entries=None, disk=0):
    """Local headers and data of `local_members` (default: all), then the central directory of
    `members` and its end record (which may claim `entries`)."""
    body = b""
    for m in members if local_members is None else local_members:
        if m.offset is None:
            m.offset = len(body)
        body += local_header(m) + m.stored
    cd = b"".join(central_entry(m) for m in members)
    n = len(members) if entries is None else entries
    end = struct.pack("<IHHHHIIH", 0x06054B50, disk, disk, n, n, len(cd), len(body), 0)
    return body + cd + end


def zip64_end(members, entries, cd_size=None):
    """One member, then a zip64 end of central directory record that claims `entries` entries
    (and a central directory of `cd_size` bytes), its locator, and an end record deferring to it."""
    body = b""
    for m in members:
        m.offset = len(body)
        body += local_header(m) + m.stored
    cd = b"".join(central_entry(m) for m in members)
    size = len(cd) if cd_size is None else cd_size
    end64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, entries, entries, size, len(body))
    locator = struct.pack("<IIQI", 0x07064B50, 0, len(body) + len(cd), 1)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + cd + end64 + locator + end


def q(**kw):
    return Member("q.npy", **kw)


def hostile():
    files = {}
    ok = archive([q(method=8), Member("k.npy")])
    files["not_a_zip"] = b"this is not an archive\n"
    files["empty"] = b""
    files["local_header_only"] = ok[:40]
    files["truncated_central_directory"] = ok[:-30]
    files["end_record_only_no_arrays"] = archive([])
    files["no_member_q"] = archive([Member("k.npy"), Member("v.npy")])
    # A tiny deflated member that claims 4 GiB, then 2^40 bytes in a zip64 entry.
    files["bomb_claims_4gib"] = archive([q(method=8, usize=0xFFFFFFF0)])
    files["bomb_zip64_claims_1tib"] = archive([q(method=8, usize=1 << 40, zip64=True)])
    # Honest sizes in the entry, but the stream goes on: 8 MiB of zeros after the .npy file.
    more = GOOD + bytes(8 << 20)
    files["bomb_inflates_past_declared_size"] = archive(
        [q(method=8, stored=deflate(more), usize=len(GOOD), crc=zlib.crc32(GOOD))])
    # The entry and the .npy header agree on 1 MiB of data, and the entry's compressed size
    # could hold it (padding after the stream), but the stream ends after 32 bytes of data.
    big = npy("(512, 512)", bytes(32))
    files["stream_shorter_than_declared"] = archive(
        [q(method=8, payload=big, stored=deflate(big) + bytes(1100), usize=len(big) + (1 << 20) - 32)])
    files["bad_crc_stored"] = archive([q(crc=0x12345678)])
    files["bad_crc_deflated"] = archive([q(method=8, crc=0x12345678)])
    files["deflate_garbage"] = archive([q(method=8, stored=b"\xff" * 64, usize=len(GOOD))])
    files["stored_size_mismatch"] = archive([q(usize=len(GOOD) + 1000)])
    # Names that escape: none of them is the member 'q'.
    files["name_dotdot"] = archive([Member("../q.npy"), Member("k.npy")])
    files["name_absolute"] = archive([Member("/q.npy")])
    files["name_in_folder"] = archive([Member("a/q.npy"), Member("..\\q.npy")])
    files["name_control_characters"] = archive([Member("q\x1b[31m\n.npy")])
    files["duplicate_names"] = archive([q(), q(payload=npy(data=struct.pack("<8f", *[9.0] * 8)))])
    # Names np.load reads as one array 'q', where it reads another member than a first match:
    # a NUL byte ends the name for Python's zipfile (it reads the second, 9.0), and .npy is
    # dropped from 'q.npy' beside a member named 'q'.
    nines = npy(data=struct.pack("<8f", *[9.0] * 8))
    files["name_nul_shadows_member"] = archive([q(), Member(b"q.npy\x00zz", payload=nines)])
    files["name_npy_beside_bare_name"] = archive([Member("q"), Member("q.npy", payload=nines)])
    # Two central entries for one local header (names differ), then an entry whose data runs
    # into the central directory, then a local header whose sizes disagree with its entry.
    a, b = q(), Member("k.npy")
    a.offset = b.offset = 0
    files["overlapping_local_headers"] = archive([a, b], local_members=[a])
    long_one = q(csize=len(GOOD) + 40, usize=len(GOOD) + 40)
    files["entry_overlaps_central_directory"] = archive([long_one])
    mismatch = q()
    mismatch.local_csize = len(GOOD) - 8
    files["local_header_disagrees"] = archive([mismatch])
    files["eocd_claims_65535_entries"] = archive([q()], entries=65535)
    files["multi_disk"] = archive([q()], disk=1)
    # zip64 end records that would have a reader allocate for 2^40 entries or a 1 PiB directory.
    files["zip64_claims_2pow40_entries"] = zip64_end([q()], 1 << 40)
    files["zip64_central_directory_1pib"] = zip64_end([q()], 1, cd_size=1 << 50)
    files["encrypted"] = archive([q(flags=1)])
    files["method_bzip2"] = archive([q(method=12)])
    files["method_lzma"] = archive([q(method=14)])
    files["method_deflate64"] = archive([q(method=9)])
    # What the member holds gets every .npy check.
    files["member_not_npy"] = archive([q(payload=b"just text, no array\n" * 4)])
    files["member_npy_claims_more"] = archive([q(payload=npy("(1000, 1000)"))])
    files["member_npy_big_endian"] = archive([q(method=8, payload=npy(descr=">f4"))])
    files["member_npy_int64"] = archive([q(payload=npy(descr="<i8", data=bytes(64)))])
    files["member_is_npz"] = archive([q(method=8, payload=ok)])
    files["member_npy_nan"] = archive([q(method=8, payload=npy(data=struct.pack("<8f", *[float("nan")] * 8)))])
    return files


def legal():
    q = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 4
    k = np.ones((8, 4), dtype=np.float32)
    files = {}
    for name, save in (("npz_savez.npz", np.savez), ("npz_savez_compressed.npz", np.savez_compressed)):
        path = os.path.join(HERE, "legal", name)
        save(path, k=k, q=q, v=k)
        files[name] = path
    # np.load reads a member named without .npy by its own name.
    with open(os.path.join(HERE, "legal", "npz_member_without_suffix.npz"), "wb") as f:
        f.write(archive([Member("q", payload=npy("(2, 4)"), method=8)]))
    return files


def main():
    folder = os.path.join(HERE, "npz")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    files = hostile()
    for name, data in files.items():
        with open(os.path.join(folder, name + ".npz"), "wb") as f:
            f.write(data)
    legal()
    print(f"npz: {len(files)} hostile files, 3 legal ones", file=sys.stderr)


if __name__ == "__main__":
    main()

"""One table of crafted `.ppk` files, each with a valid header CRC, run through both readers:
`pipeprof.data.PackedFile` (Python) and pipeprof's own (Rust: `pipeprof profile --data FILE`,
which opens and checks the file before anything else). A hostile row must be refused by both
(Python: a `PackedFileError` naming the file, never another exception; pipeprof: "damaged");
a benign row (the edges of what is allowed) must be read by both."""

import json
import os
import struct
import subprocess
import zlib

import numpy as np
import pytest
from conftest import HANG_S, pipeprof_bin

from pipeprof.data import PackedFile, PackedFileError

N, H, W = 4, 8, 8
SOURCE = "/nonexistent/pipeprof-hostile-source"


def base_meta():
    return {
        "format": "pipeprof-packed-images",
        "source": SOURCE,
        "layout": "imagefolder",
        "size": {"mode": "fixed", "height": H, "width": W},
        "resample": "bilinear",
        "classes": ["a", "b"],
        "names": ["a/0.png", "a/1.png", "b/2.png", "b/3.png"],
        "skipped": [],
    }


def write_ppk(path, meta=None, raw_meta=None, c=3, head_hw=(H, W), sizes=None, pixels_off=4096, flip=None):
    """A version-2 file of N images (`sizes`: each one's (h, w), default the header's), its
    header CRC right for whatever it holds. `raw_meta`: metadata bytes as they are; `flip`:
    a pixel byte changed after its image's CRC was taken."""
    sizes = sizes or [(H, W)] * N
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, size=h * w * c, dtype=np.uint8).tobytes() for h, w in sizes]
    crcs = [zlib.crc32(b) for b in images]
    pixels = bytearray(b"".join(images))
    if flip is not None:
        pixels[flip] ^= 1
    offsets = np.concatenate(([0], np.cumsum([len(b) for b in images])))[:-1] + pixels_off
    labels = struct.pack(f"<{N}I", 0, 0, 1, 1)
    crcs_b = struct.pack(f"<{N}I", *crcs)
    index = b"".join(struct.pack("<QII", int(o), h, w) for o, (h, w) in zip(offsets, sizes))
    meta_b = raw_meta if raw_meta is not None else json.dumps(meta if meta is not None else base_meta()).encode()
    labels_off = pixels_off + len(pixels)
    crcs_off = labels_off + len(labels)
    index_off = crcs_off + len(crcs_b)
    meta_off = index_off + len(index)
    file_len = meta_off + len(meta_b)
    fields = struct.pack("<4I9Q", 2, head_hw[0], head_hw[1], c, N, 0, pixels_off, labels_off, crcs_off, meta_off, len(meta_b), file_len, index_off)
    head = b"\x89PPK\r\n\x1a\n" + fields
    head += bytes(124 - len(head))
    crc = zlib.crc32(labels + crcs_b + index + meta_b, zlib.crc32(head + bytes(4)))
    body = bytearray(max(pixels_off + len(pixels), 128))
    body[pixels_off : pixels_off + len(pixels)] = pixels
    body[:128] = head + struct.pack("<I", crc)
    path.write_bytes(bytes(body) + labels + crcs_b + index + meta_b)
    return path


def meta_with(**changes):
    m = base_meta()
    for k, v in changes.items():
        if v is DROP:
            del m[k]
        else:
            m[k] = v
    return m


DROP = object()


def nested(depth):
    """A JSON value `depth` arrays deep."""
    return "[" * depth + "]" * depth


def raw(changes_text):
    """The base metadata with `"skipped": []` replaced by this text (JSON written by hand)."""
    return json.dumps(base_meta()).replace('"skipped": []', changes_text).encode()


# (id, write_ppk's keyword arguments): every one must be refused by both readers.
HOSTILE = [
    ("metadata is a list", dict(raw_meta=b"[]")),
    ("metadata is the fields as a list", dict(raw_meta=json.dumps(["pipeprof-packed-images", SOURCE, None, "imagefolder", {"mode": "fixed", "height": H, "width": W}, "bilinear", ["a", "b"], ["a/0.png", "a/1.png", "b/2.png", "b/3.png"], []]).encode())),
    ("metadata is a string", dict(raw_meta=b'"hello"')),
    ("classes nested 100000 deep", dict(raw_meta=json.dumps(base_meta()).replace('"classes": ["a", "b"]', '"classes": ' + nested(100000)).encode())),
    ("an unknown key nested 128 deep", dict(raw_meta=raw('"skipped": [], "x": ' + nested(127)))),
    ("names not strings", dict(meta=meta_with(names=[1, 2, 3, 4]))),
    ("classes not strings", dict(meta=meta_with(classes=[None, {"a": 1}]))),
    ("classes an object", dict(meta=meta_with(classes={"a": 0, "b": 1}))),
    ("skipped entry of one string", dict(meta=meta_with(skipped=[["a/x.png"]]))),
    ("size a list", dict(meta=meta_with(size=["fixed", H, W]))),
    ("size height a float", dict(meta=meta_with(size={"mode": "fixed", "height": 8.0, "width": W}))),
    ("size height negative", dict(meta=meta_with(size={"mode": "fixed", "height": -8, "width": W}))),
    ("size mode unknown", dict(meta=meta_with(size={"mode": "huge"}))),
    ("size missing", dict(meta=meta_with(size=DROP))),
    ("layout unknown", dict(meta=meta_with(layout="tensorflow"))),
    ("layout null", dict(meta=meta_with(layout=None))),
    ("format another", dict(meta=meta_with(format="something-else"))),
    ("resample missing", dict(meta=meta_with(resample=DROP))),
    ("model a number", dict(meta=meta_with(model=5))),
    ("a lone surrogate escape in a name", dict(raw_meta=json.dumps(base_meta()).replace("a/0.png", "a/\\udce9.png").encode())),
    ("a byte that is not UTF-8 in a name", dict(raw_meta=json.dumps(base_meta()).encode().replace(b"a/0.png", b"a/\xe9.png"))),
    ("NaN in an unknown key", dict(raw_meta=raw('"skipped": [], "x": NaN'))),
    ("1e400 in an unknown key", dict(raw_meta=raw('"skipped": [], "x": 1e400'))),
    ("a 400-digit integer in an unknown key", dict(raw_meta=raw('"skipped": [], "x": 1' + "0" * 400))),
    ("a duplicate key whose last value is wrong", dict(raw_meta=raw('"skipped": [], "names": 5'))),
    ("exact a list", dict(meta=meta_with(exact=[]))),
    ("exact hex not hex", dict(meta=meta_with(exact={"names": [[0, "zz"]]}))),
    ("exact hex upper case", dict(meta=meta_with(exact={"names": [[0, "E9"]]}))),
    ("exact index past the names", dict(meta=meta_with(exact={"names": [[4, "e9"]]}))),
    ("exact indices not increasing", dict(meta=meta_with(exact={"classes": [[1, "e9"], [0, "e9"]]}))),
    ("exact source not hex", dict(meta=meta_with(exact={"source": "/x"}))),
    ("4 channels", dict(c=4)),
    ("2 channels", dict(c=2)),
    ("header 8x8, index 4x16 (batch reads other pixels)", dict(sizes=[(4, 16)] * N)),
    ("header 8x0", dict(head_hw=(H, 0), sizes=[(H, W)] * N)),
    ("pixels inside the header", dict(pixels_off=64)),
    ("an image's pixels differ from its CRC", dict(flip=3 * H * W * 3 + 5)),
]

# (id, write_ppk's keyword arguments): the edges of what is allowed, read by both readers.
BENIGN = [
    ("the base file", dict()),
    ("an unknown key nested 127 deep", dict(raw_meta=raw('"skipped": [], "x": ' + nested(126)))),
    ("a duplicate key whose last value is right", dict(raw_meta=raw('"skipped": 5, "skipped": []'))),
    ("exact null, model null", dict(meta=meta_with(exact=None, model=None))),
    ("exact with a name and the source", dict(meta=meta_with(exact={"source": "2f6e6f6e6578697374656e74e9", "names": [[0, "612fe92e706e67"]]}))),
    ("1e300 in an unknown key", dict(raw_meta=raw('"skipped": [], "x": 1e300'))),
    ("a size with an unknown key", dict(meta=meta_with(size={"mode": "fixed", "height": H, "width": W, "x": [1]}))),
    ("sizes that vary", dict(head_hw=(0, 0), sizes=[(8, 8), (4, 16), (2, 3), (9, 1)], meta=meta_with(size={"mode": "as-stored"}))),
]


def python_reads(path):
    """Opens `path` and reads every image (one by one, and as one batch when they have one
    size); a `PackedFileError` is returned, anything else raised."""
    try:
        f = PackedFile(path)
        for i in range(len(f)):
            f.image(i)
        if f.height:
            f.batch(np.arange(len(f)))
        return None
    except PackedFileError as e:
        return e


def pipeprof_reads(path):
    """pipeprof's reader on `path`: (refused, its stderr). `profile --data FILE` opens and
    checks the file first; the built-in model's 64×64 input then refuses these 8×8 images
    with "holds … images", which says the file itself was read."""
    p = subprocess.run([pipeprof_bin(), "profile", "--data", str(path), "--steps", "1"], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode != 0, f"pipeprof trained on {path}?\n{p.stderr}"
    refused = "is damaged" in p.stderr or "is not a pipeprof cache" in p.stderr
    assert refused or " holds " in p.stderr, p.stderr
    return refused, p.stderr


@pytest.mark.parametrize("kwargs", [k for _, k in HOSTILE], ids=[i for i, _ in HOSTILE])
def test_both_readers_refuse_a_hostile_file(tmp_path, kwargs):
    path = write_ppk(tmp_path / "hostile.ppk", **kwargs)
    err = python_reads(path)
    assert err is not None, "the Python reader read it"
    assert str(path) in str(err), err
    refused, stderr = pipeprof_reads(path)
    assert refused, f"pipeprof read it:\n{stderr}"
    assert "hostile.ppk" in stderr


@pytest.mark.parametrize("kwargs", [k for _, k in BENIGN], ids=[i for i, _ in BENIGN])
def test_both_readers_read_the_edges_of_what_is_allowed(tmp_path, kwargs):
    path = write_ppk(tmp_path / "edge.ppk", **kwargs)
    assert python_reads(path) is None
    refused, stderr = pipeprof_reads(path)
    assert not refused, stderr


def test_exact_names_are_what_os_fsdecode_gives(tmp_path):
    """The benign `exact` row, read: the source and the name are the bytes' os.fsdecode."""
    f = PackedFile(write_ppk(tmp_path / "x.ppk", **dict(BENIGN)["exact with a name and the source"]))
    assert f.source == os.fsdecode(b"/nonexistent\xe9")
    assert f.names[0] == os.fsdecode(b"a/\xe9.png") == "a/\udce9.png"
    assert f.names[1:] == base_meta()["names"][1:]

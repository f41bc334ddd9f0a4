"""The one PIL patch (``pipeprof._pil``), in this process, with the spans it sends caught: who
times a PIL call is where the thread is in a loader's work (``_state.THREAD``), one thread-local
for the DataLoader fetcher and the Keras loaders alike."""

import contextlib

import numpy as np
import pytest
from PIL import Image, ImageFile

import pipeprof
from pipeprof import _native, _pil, _state


@pytest.fixture
def sent(monkeypatch, tmp_path):
    """PIL patched for this test only; the stages it sends, DataLoader spans as ``("span",
    stage)``, the Keras way's as ``("record", stage)``."""
    for owner, name in ((Image, "open"), (Image.Image, "convert"), (Image.Image, "resize"), (ImageFile.ImageFile, "load")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    got = []

    @contextlib.contextmanager
    def span(stage):
        got.append(("span", stage))
        yield

    class Span:
        def __init__(self, stage):
            self.cm = span(stage)

        def __enter__(self):
            return self.cm.__enter__()

        def __exit__(self, *exc):
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(pipeprof, "span", Span)
    monkeypatch.setattr(_native, "record", lambda stage, *a: got.append(("record", stage)))
    _pil.install()
    _state.THREAD.forget()
    yield got
    _state.THREAD.forget()


@pytest.fixture
def png(tmp_path):
    path = tmp_path / "a.png"
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(path)
    return path


def in_fetch():
    """Inside a DataLoader fetcher's samples (``_torch_fetch._samples``)."""
    _state.THREAD.in_fetch = True


def in_keras_item():
    """Inside a Keras batch (``_keras_data._item``)."""
    t = _state.THREAD
    t.in_item, t.depth = True, t.depth + 1


def in_load_img():
    """Inside Keras's ``load_img``: the parts are added up, none sent."""
    t = _state.THREAD
    t.img = {"read": [0, 0, 0], "decode": [0, 0, 0], "resize": [0, 0, 0]}
    t.depth += 1


def open_convert(png):
    Image.open(png).convert("RGB")


def open_load_resize(png):
    im = Image.open(png)
    im.load()
    im.resize((4, 4))


def from_memory(png):
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).convert("RGB").resize((4, 4))


@pytest.mark.parametrize(
    "where, work, expected",
    [
        # A DataLoader's samples: the outermost call is a span; convert decodes a file opened
        # lazily and converts pixels made in memory; resize is no span (torchvision's is).
        (in_fetch, open_convert, [("span", "read"), ("span", "decode")]),
        # (resize's own load() of decoded pixels is a decode span of nothing, as it always was)
        (in_fetch, open_load_resize, [("span", "read"), ("span", "decode"), ("span", "decode")]),
        (in_fetch, from_memory, [("span", "convert")]),
        # A Keras batch: each call its span with the thread's clocks, the decode inside convert
        # included; a resize of pixels in memory is one too.
        (in_keras_item, open_convert, [("record", "read"), ("record", "decode")]),
        (in_keras_item, open_load_resize, [("record", "read"), ("record", "decode"), ("record", "resize")]),
        (in_keras_item, from_memory, [("record", "resize")]),
        # load_img adds its parts up and sends them itself.
        (in_load_img, open_load_resize, []),
        # Outside a loader's work nothing is timed.
        (lambda: None, open_convert, []),
        (lambda: None, open_load_resize, []),
    ],
)
def test_who_times_a_pil_call_is_where_the_thread_is(sent, png, where, work, expected):
    where()
    work(png)
    assert sent == expected


def test_a_span_inside_a_samples_pil_call_covers_the_samples(sent, png):
    in_fetch()
    assert not _state.THREAD.fetch_covered
    open_convert(png)
    assert _state.THREAD.fetch_covered and not _state.THREAD.item_covered
    assert _state.THREAD.depth == 0


def test_load_img_gets_read_decode_and_resize_apart(sent, png):
    in_load_img()
    open_load_resize(png)
    parts = _state.THREAD.img
    assert all(parts[s][0] > 0 for s in ("read", "decode", "resize")), parts
    assert sent == [] and _state.THREAD.depth == 1


def test_each_pil_function_is_patched_once(sent):
    patched = (Image.open, Image.Image.convert, Image.Image.resize, ImageFile.ImageFile.load)
    _pil.install()
    assert (Image.open, Image.Image.convert, Image.Image.resize, ImageFile.ImageFile.load) == patched
    assert all(getattr(f, "_pipeprof", False) and not getattr(f.__wrapped__, "_pipeprof", False) for f in patched)

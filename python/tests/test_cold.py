"""The hook's timing, at a run's end, of its loader's work cold and fed (pipeprof._cold): nothing
where the reads are fast, the three costs where they are slow, the pack's images at the
transform's leading Resize, and never in a --check-advice re-run."""

from PIL import Image
from torchvision import datasets, transforms

from pipeprof import _cold, _state


def folder(tmp_path, n=12):
    for k in range(n):
        d = tmp_path / f"c{k % 2}"
        d.mkdir(exist_ok=True)
        Image.new("RGB", (40 + k, 30), (k * 20, 100, 200)).save(d / f"{k}.jpg")
    return tmp_path


class Recorder:
    """A transform that keeps the sizes it was given."""

    def __init__(self):
        self.sizes = []

    def __call__(self, img):
        self.sizes.append(img.size)
        return img


def test_fast_reads_are_not_timed(tmp_path):
    seen = Recorder()
    ds = datasets.ImageFolder(folder(tmp_path), transform=seen)
    assert _cold.measure(ds, slow_read_ms=1e9) is None
    assert seen.sizes == [], "nothing decoded or transformed once the storage read fast"


def test_slow_reads_give_the_cold_the_fed_and_the_packed_cost(tmp_path, monkeypatch):
    real = _cold._read
    # Each read blocked 5 ms, as a network drive's.
    monkeypatch.setattr(_cold, "_read", lambda p: (real(p)[0], 5_000_000))
    seen = Recorder()
    tf = transforms.Compose([transforms.Resize((8, 6)), seen, transforms.ToTensor()])
    ds = datasets.ImageFolder(folder(tmp_path), transform=tf)
    got = _cold.measure(ds, pairs=4, slow_read_ms=1.0, rounds=2)
    assert got is not None
    assert (got["after_wait_ms"], got["images"]) == (5.0, 4), got
    assert all(got[k] > 0 for k in ("cold_ms", "fed_ms", "packed_ms")), got
    # The first image paged the code in; then 4 cold, 2 rounds of 4 fed, and 4 stored through
    # the leading Resize then 2 rounds of 4 packed: every one at the Resize's size (W, H).
    assert len(seen.sizes) == 1 + 4 + 8 + 8, seen.sizes
    assert set(seen.sizes) == {(6, 8)}, seen.sizes
    # Without a transform: decode alone, no packed figure.
    plain = datasets.ImageFolder(folder(tmp_path))
    got = _cold.measure(plain, pairs=3, slow_read_ms=1.0, rounds=1)
    assert got is not None and "packed_ms" not in got and got["images"] == 3, got


def test_an_image_is_packed_at_the_leading_resize_or_as_decoded():
    img = Image.new("RGB", (50, 40))
    assert _cold._packed(img, transforms.Compose([transforms.Resize((10, 20)), transforms.ToTensor()])).size == (20, 10)
    assert _cold._packed(img, transforms.Resize(20)).size == (25, 20)
    assert _cold._packed(img, transforms.Compose([transforms.CenterCrop(10), transforms.Resize(5)])).size == (50, 40)


def test_only_the_first_reader_of_a_plain_run_is_remembered(monkeypatch):
    registered = []
    monkeypatch.setattr(_cold.atexit, "register", registered.append)
    monkeypatch.setattr(_cold, "_SEEN", [])
    monkeypatch.setattr(_cold.pipeprof, "is_main", lambda: True)
    monkeypatch.setattr(_state.CHECK, "asked", {"steps": 3})
    _cold.remember("re-run's")
    assert (_cold._SEEN, registered) == ([], []), "a --check-advice re-run is not timed"
    monkeypatch.setattr(_state.CHECK, "asked", None)
    _cold.remember("first", print)
    _cold.remember("second")
    assert (_cold._SEEN, registered) == ([("first", print)], [_cold._at_exit])


def test_at_exit_times_nothing_after_an_exception_or_in_an_emptied_stretch(monkeypatch):
    measured, sent = [], []
    monkeypatch.setattr(_cold, "measure", lambda ds: measured.append(ds) or {"fed_ms": 1.0})
    monkeypatch.setattr(_cold.pipeprof, "settings", lambda **kw: sent.append(kw))
    monkeypatch.setattr(_cold, "_SEEN", [])
    _cold._at_exit()
    assert (measured, sent) == ([], []), "a notebook's stretch put the list back: nothing to time"
    closed = []
    monkeypatch.setattr(_cold, "_SEEN", [("ds", lambda: closed.append(True))])
    monkeypatch.setattr(_cold.sys, "last_value", KeyboardInterrupt(), raising=False)
    _cold._at_exit()
    assert (measured, sent) == ([], []), "a program ended by Ctrl-C or an exception is not kept waiting"
    monkeypatch.delattr(_cold.sys, "last_value")
    _cold._at_exit()
    assert (measured, sent, closed) == (["ds"], [{"cold_cpu": {"fed_ms": 1.0}}], [True]), "the open step closed first"
    # Ctrl-C during the timing: nothing sent, nothing raised.
    monkeypatch.setattr(_cold, "measure", lambda ds: (_ for _ in ()).throw(KeyboardInterrupt()))
    _cold._at_exit()
    assert len(sent) == 1

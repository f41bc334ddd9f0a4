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
    # What it arms besides (tested on their own below): not in pytest's own process.
    monkeypatch.setattr(_cold, "_keep_drawn", lambda ds: None)
    monkeypatch.setattr(_cold, "_keep_exit_status", lambda: None)
    monkeypatch.setattr(_state.CHECK, "asked", {"steps": 3})
    _cold.remember("re-run's")
    assert (_cold._SEEN, registered) == ([], []), "a --check-advice re-run is not timed"
    monkeypatch.setattr(_state.CHECK, "asked", None)
    _cold.remember("first", print)
    _cold.remember("second")
    assert (_cold._SEEN, registered) == ([("first", print)], [_cold._at_exit])


def test_at_exit_times_nothing_after_an_exception_or_in_an_emptied_stretch(monkeypatch):
    measured, sent = [], []
    monkeypatch.setattr(_cold, "measure", lambda ds, drawn=None: measured.append(ds) or {"fed_ms": 1.0})
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
    monkeypatch.setattr(_cold, "measure", lambda ds, drawn=None: (_ for _ in ()).throw(KeyboardInterrupt()))
    _cold._at_exit()
    assert len(sent) == 1


def test_a_program_that_exits_with_an_error_or_after_ctrl_c_is_not_timed(monkeypatch):
    measured = []
    monkeypatch.setattr(_cold, "measure", lambda ds, drawn=None: measured.append(drawn) or None)
    monkeypatch.setattr(_cold, "_SEEN", [("ds", None)])
    monkeypatch.setattr(_cold, "_DRAWN", [3, 1])
    # sys.exit(1) after a failure, sys.exit(130) after a caught Ctrl-C: nothing timed.
    for status in (1, 130, "failed"):
        monkeypatch.setattr(_cold, "_EXIT", [status])
        _cold._at_exit()
    assert measured == [], measured
    for status in ([], [0], [None]):
        monkeypatch.setattr(_cold, "_EXIT", status)
        _cold._at_exit()
    assert measured == [[3, 1]] * 3, "a clean exit is timed, on the images the program read"


def test_the_exit_status_asked_for_is_kept(monkeypatch):
    monkeypatch.setattr(_cold.sys, "exit", _cold.sys.exit)
    monkeypatch.setattr(_cold, "_EXIT", [])
    _cold._keep_exit_status()
    for status in (130, None):
        try:
            _cold.sys.exit(status)
        except SystemExit as e:
            assert e.code == status
    assert _cold._EXIT == [130, None]


def test_only_images_the_program_read_are_timed_and_the_reads_are_bounded(tmp_path, monkeypatch):
    real, opened = _cold._read, []
    monkeypatch.setattr(_cold, "_read", lambda p: opened.append(str(p)) or (real(p)[0], 5_000_000))
    ds = datasets.ImageFolder(folder(tmp_path, n=12))
    drawn = [7, 2, 7, 9, 4, 11]
    got = _cold.measure(ds, pairs=16, slow_read_ms=1.0, rounds=1, drawn=drawn)
    assert got is not None and got["images"] == 4, got
    assert sorted(opened) == sorted(ds.samples[i][0] for i in set(drawn)), opened
    # No image read: nothing to time, nothing opened.
    opened.clear()
    assert _cold.measure(ds, slow_read_ms=1.0, drawn=[]) is None and opened == []
    # Past the budget after the first read: no more reads, no figure.
    assert _cold.measure(ds, slow_read_ms=1.0, drawn=drawn, budget_s=0.0) is None
    assert len(opened) == 1, opened


def test_the_indices_the_loader_draws_from_the_timed_data_set_are_kept(tmp_path, monkeypatch):
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data import dataloader as dl

    monkeypatch.setattr(dl._BaseDataLoaderIter, "_next_index", dl._BaseDataLoaderIter._next_index)
    ds = datasets.ImageFolder(folder(tmp_path, n=12), transform=transforms.Compose([transforms.Resize((8, 8)), transforms.ToTensor()]))
    other = torch.utils.data.TensorDataset(torch.zeros(20, 1))
    monkeypatch.setattr(_cold, "_SEEN", [(ds, None)])
    monkeypatch.setattr(_cold, "_DRAWN", [])
    _cold._keep_drawn(ds)
    for i, _ in enumerate(DataLoader(ds, batch_size=3, shuffle=True, num_workers=2)):
        if i == 1:
            break
    list(DataLoader(other, batch_size=5))
    drawn = list(_cold._DRAWN)
    # The two batches taken, and what the workers were sent ahead of them (one epoch's at
    # most); none of the other data set's (its indices 12-19 would show).
    assert 6 <= len(drawn) <= 12 and len(set(drawn)) == len(drawn), drawn
    assert all(0 <= i < 12 for i in drawn), drawn

"""What a PyTorch program's settings tell the pack advice: whether its dataset is torchvision's
folder reader (only then does PackedImageFolder replace it) and the resize its transforms begin
with (the size `pipeprof pack` must store for the program to see the pixels it saw). Checked
end to end: a pack at the size the settings name gives the program ImageFolder's tensors."""

import subprocess

import numpy as np
import pytest
import torch
from conftest import pipeprof_bin
from PIL import Image
from torchvision import datasets, transforms
from torchvision.transforms import v2

from pipeprof.data import PackedImageFolder
from pipeprof.torch import loader_settings


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two classes of photo-like images, not square (120×60 and 50×90), so that a square pack
    would squash them."""
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(3)
    for c, (w, h) in enumerate([(120, 60), (50, 90)]):
        (root / f"c{c}").mkdir()
        for i in range(3):
            y, x = np.mgrid[0:h, 0:w]
            px = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], axis=2) + rng.integers(0, 30, (h, w, 3))
            Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(root / f"c{c}" / f"{i}.png")
    return root


def settings_of(ds):
    return loader_settings(torch.utils.data.DataLoader(ds, batch_size=2))


class OwnClasses(datasets.ImageFolder):
    def find_classes(self, directory):
        return ["c1", "c0"], {"c1": 0, "c0": 1}


class Csv(torch.utils.data.Dataset):
    root = "data"

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(3), 0


# (what the program writes, folder_dataset, leading_resize)
CASES = [
    ("ImageFolder, Resize(36) then CenterCrop(32)", lambda d: datasets.ImageFolder(d, transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32), transforms.ToTensor()])), True, {"shorter": 36}),
    ("ImageFolder, Resize((32, 48))", lambda d: datasets.ImageFolder(d, transforms.Compose([transforms.Resize((32, 48)), transforms.ToTensor()])), True, {"exact": {"height": 32, "width": 48}}),
    ("ImageFolder, a lone Resize([40])", lambda d: datasets.ImageFolder(d, transforms.Resize([40])), True, {"shorter": 40}),
    ("ImageFolder, v2 Resize(30)", lambda d: datasets.ImageFolder(d, v2.Compose([v2.Resize(30), v2.ToImage()])), True, {"shorter": 30}),
    ("ImageFolder, RandomResizedCrop first", lambda d: datasets.ImageFolder(d, transforms.Compose([transforms.RandomResizedCrop(32), transforms.ToTensor()])), True, None),
    ("ImageFolder, a bicubic Resize", lambda d: datasets.ImageFolder(d, transforms.Compose([transforms.Resize(36, interpolation=transforms.InterpolationMode.BICUBIC), transforms.ToTensor()])), True, None),
    ("ImageFolder, no transform", lambda d: datasets.ImageFolder(d), True, None),
    ("ImageFolder, its own loader", lambda d: datasets.ImageFolder(d, loader=lambda p: Image.open(p).convert("L")), False, None),
    ("ImageFolder, its own is_valid_file", lambda d: datasets.ImageFolder(d, is_valid_file=lambda p: p.endswith(".png")), False, None),
    ("ImageFolder, its own find_classes", lambda d: OwnClasses(d), False, None),
    ("a Dataset of its own with a root", lambda d: Csv(), False, None),
]


@pytest.mark.parametrize("name,make,folder_dataset,resize", CASES, ids=[c[0] for c in CASES])
def test_the_settings_say_the_folder_reader_and_its_leading_resize(folder, name, make, folder_dataset, resize):
    s = settings_of(make(str(folder)))
    assert s.get("folder_dataset", False) is folder_dataset, s
    assert s.get("leading_resize") == resize, s


def test_a_pack_at_the_leading_resize_gives_the_program_imagefolders_tensors(folder, tmp_path):
    """Resize(36) then CenterCrop(32) on 120×60 and 50×90 images: packed with --shorter 36 (what
    the advice names), the program's tensors are ImageFolder's within rounding; packed at the
    model's 32×32 (what the advice named before) they are not."""
    tf = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(32), transforms.PILToTensor()])
    plain = datasets.ImageFolder(str(folder), tf)
    assert settings_of(plain)["leading_resize"] == {"shorter": 36}

    def packed(flag):
        out = tmp_path / f"{flag[-1]}.ppk"
        subprocess.run([pipeprof_bin(), "pack", str(folder), str(out), *flag], check=True, capture_output=True)
        return PackedImageFolder(str(out), transform=tf)

    def worst(ds):
        return max(int((ds[i][0].int() - plain[i][0].int()).abs().max()) for i in range(len(plain)))

    assert worst(packed(["--shorter", "36"])) <= 2
    assert worst(packed(["--size", "32"])) > 20

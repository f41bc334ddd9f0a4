"""Stages named for what the code does: torchvision's transforms by class, never by their place
in a ``Compose``; an in-memory data set (torchvision's MNIST pattern) has no read, decode or
resize; a transform class of the program's own is timed as ``transform`` under its name."""

import sys
import textwrap

from conftest import count, stage
from test_frameworks import run

# torchvision's MNIST, on generated data: uint8 images in memory, Image.fromarray, then the
# transform; with a transform class of the program's own.
MNIST_LIKE = """
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms

    class AddNoise:
        def __call__(self, x):
            return x + 0.01 * torch.randn_like(x)

    class Digits(Dataset):
        def __init__(self, n, transform):
            g = torch.Generator().manual_seed(0)
            self.data = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
            self.targets = torch.randint(0, 10, (n,), generator=g)
            self.transform = transform

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            img = Image.fromarray(self.data[i].numpy(), mode="L")
            return self.transform(img), int(self.targets[i])

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,)), AddNoise()])
    loader = DataLoader(Digits(256, tf), batch_size=8)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    print("done")
"""


def test_torchvision_transforms_are_staged_by_what_they_do():
    from pipeprof._torch_fetch import stage_of_name

    table = {
        "Resize": "resize",
        "CenterCrop": "resize",
        "RandomResizedCrop": "resize",
        "RandomCrop": "resize",
        "ToTensor": "convert",
        "PILToTensor": "convert",
        "ToImage": "convert",
        "ToDtype": "convert",
        "ConvertImageDtype": "convert",
        "Normalize": "convert",
        "RandomHorizontalFlip": "augment",
        "RandomRotation": "augment",
        "ColorJitter": "augment",
        "GaussianBlur": "augment",
        "TrivialAugmentWide": "augment",
        "RandomSomethingNew": "augment",
        "MyCrop": None,
        "Lambda": None,
    }
    for name, want in table.items():
        assert stage_of_name(name) == want, name


def test_an_in_memory_data_set_has_no_read_decode_or_resize(tmp_path):
    script = tmp_path / "mnist_like.py"
    script.write_text(textwrap.dedent(MNIST_LIKE))
    _, s, _, _ = run(tmp_path, sys.executable, script)
    for absent in ("read", "decode", "resize"):
        assert count(s, absent) == 0, (absent, s["stages"])
    # ToTensor + Normalize: convert; AddNoise: the program's own, named.
    assert count(s, "convert") > 0 and count(s, "transform") > 0, s["stages"]
    assert s["settings"]["transforms"] == ["AddNoise"], s["settings"]
    assert stage(s, "convert")["on_cpu"] is not None
    # Nothing here is packed or resized offline: the advice never says so.
    said = " ".join(a["action"] for a in (s.get("verdict") or {}).get("advice", []))
    assert "memory-mapped" not in said and "pre-resize" not in said, said

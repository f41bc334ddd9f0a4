"""Under `pipeprof run` the program's own objects and processes behave as without it: the
DataLoader hook survives a data set whose attributes raise and an iterator that refuses new
attributes, and asks for its length no more than it must (issue 41, row H3)."""

import sys
import textwrap

from test_frameworks import run

HOSTILE_DATASET = """
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    LENS = [0]

    class Hostile(Dataset):
        @property
        def classes(self):
            raise RuntimeError("classes are computed lazily and failed")

        @property
        def root(self):
            raise KeyError("root")

        def __len__(self):
            LENS[0] += 1
            return 16

        def __getitem__(self, i):
            return torch.zeros(3, 4, 4), i % 2

    class Refusing(_SingleProcessDataLoaderIter):
        def __setattr__(self, name, value):
            if name.startswith("_pipeprof"):
                raise TypeError("no new attributes")
            super().__setattr__(name, value)

    class Loader(DataLoader):
        def _get_iterator(self):
            return Refusing(self)

    model = torch.nn.Linear(48, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = Hostile()
    loader = Loader(ds, batch_size=4)
    LENS[0] = 0
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("LENS", LENS[0])
"""


def test_a_dataset_whose_attributes_raise_and_an_iterator_that_refuses_attributes_run_as_without_pipeprof(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(textwrap.dedent(HOSTILE_DATASET))
    plain = __import__("subprocess").run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    # Before: RuntimeError from `classes` (or TypeError from the iterator) ended the run with 1.
    code, s, out, err = run(tmp_path, sys.executable, script, check=False)
    assert code == 0, err + out
    assert s["steps"] == 12, s
    # The Dataset's __len__ (the program's code) is asked once for the run's settings and once
    # for the loader's length, not again every pass (before: once more each epoch).
    plain_lens = int(plain.stdout.split("LENS")[1])
    lens = int(out.split("LENS")[1].split()[0])
    assert lens - plain_lens <= 2, (lens, plain_lens)
    # What could not be read is unknown, not a failure.
    assert "failed" not in s, s.get("failed")

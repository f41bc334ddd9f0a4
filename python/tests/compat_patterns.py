"""Real-world PyTorch training patterns, each seeded, each printing its losses: run once plainly
and once under ``pipeprof run``, the two outputs must be equal bit for bit (test_compat.py).

Every pattern trains a few steps of a small model on the CPU and returns the float losses it
saw (``loss.item()``, as scripts print them). A pattern that raises reports the exception
instead, so a hook that breaks one pattern is named, not hidden.
"""

import collections
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

torch.set_num_threads(1)


def data(n=64, shape=(3, 8, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand((n, *shape), generator=g), torch.randint(0, 4, (n,), generator=g)


def cnn():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 4))


def train(model, batches, steps=None, to=lambda x: x):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i, (x, y) in enumerate(batches):
        if steps is not None and i >= steps:
            break
        x, y = to(x), to(y)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def lazy_module_to_device():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    net.to("cpu")  # uninitialised parameters moved: torch allows only its own Tensor.to here
    xs, ys = data()
    return train(net, DataLoader(TensorDataset(xs, ys), batch_size=16), to=lambda t: t.to("cpu"))


class Logged(torch.Tensor):
    """A __torch_function__ subclass that records the functions it sees."""

    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def tensor_subclass():
    torch.manual_seed(0)
    Logged.seen.clear()
    xs, ys = data()
    losses = train(cnn(), DataLoader(TensorDataset(xs, ys), batch_size=16), to=lambda t: t.as_subclass(Logged).to("cpu"))
    # What the subclass saw is the program's business: it must not change under pipeprof.
    return losses + [float(len(Logged.seen)), float(Logged.seen.count("to"))]


class DictData(Dataset):
    def __init__(self):
        self.xs, self.ys = data()

    def __len__(self):
        return len(self.xs)

    def __getitem__(self, i):
        return {"image": self.xs[i], "label": self.ys[i]}


Pair = collections.namedtuple("Pair", "image label")


class NamedData(DictData):
    def __getitem__(self, i):
        return Pair(self.xs[i], self.ys[i])


def dict_batches():
    torch.manual_seed(0)
    loader = DataLoader(DictData(), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    return train(cnn(), ((b["image"], b["label"]) for b in loader))


def namedtuple_batches():
    torch.manual_seed(0)
    loader = DataLoader(NamedData(), batch_size=16)
    out = []
    for b in loader:
        assert isinstance(b, Pair), type(b)
        out.append((b.image, b.label))
    return train(cnn(), out)


def non_blocking_channels_last_dtype():
    torch.manual_seed(0)
    xs, ys = data()
    net = cnn().to(memory_format=torch.channels_last)

    def to(t):
        t = t.to("cpu", non_blocking=True)
        return t.to(torch.float32).contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    return train(net, DataLoader(TensorDataset(xs.double(), ys), batch_size=16, pin_memory=False), to=to)


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        xs, ys = data()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(lo, len(xs), step):
            yield xs[i], ys[i]


def iterable_with_workers():
    torch.manual_seed(0)
    losses = train(cnn(), DataLoader(Stream(), batch_size=8, num_workers=2))
    return sorted(losses)  # two workers interleave: the set of batches is what is fixed


def batch_sampler_and_collate():
    torch.manual_seed(0)
    xs, ys = data()
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(64)), batch_size=12, drop_last=False)

    def collate(samples):
        x = torch.stack([s[0] for s in samples]) * 2.0
        return x, torch.stack([s[1] for s in samples])

    return train(cnn(), DataLoader(TensorDataset(xs, ys), batch_sampler=sampler, collate_fn=collate))


class MyLoader(DataLoader):
    def __iter__(self):
        for x, y in super().__iter__():
            yield x.flip(-1), y


def dataloader_subclass():
    torch.manual_seed(0)
    xs, ys = data()
    return train(cnn(), MyLoader(TensorDataset(xs, ys), batch_size=16))


def autocast_and_inference_validation():
    torch.manual_seed(0)
    xs, ys = data()
    net = cnn()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    out = []
    for epoch in range(2):
        for x, y in DataLoader(TensorDataset(xs, ys), batch_size=16):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        with torch.inference_mode():
            val = sum(nn.functional.cross_entropy(net(x), y).item() for x, y in DataLoader(TensorDataset(xs, ys), batch_size=32))
        out.append(val)
    return out


def break_and_reiterate():
    torch.manual_seed(0)
    xs, ys = data()
    loader = DataLoader(TensorDataset(xs, ys), batch_size=8, num_workers=1)
    net = cnn()
    return train(net, loader, steps=3) + train(net, loader, steps=2) + train(net, iter(loader), steps=1)


def zipped_loaders():
    torch.manual_seed(0)
    xs, ys = data()
    a = DataLoader(TensorDataset(xs, ys), batch_size=16)
    b = DataLoader(TensorDataset(xs.flip(0), ys.flip(0)), batch_size=16)
    net = cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    out = []
    for (x1, y1), (x2, y2) in zip(a, b):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(torch.cat([x1, x2])), torch.cat([y1, y2]))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def compiled_model():
    torch.manual_seed(0)
    xs, ys = data()
    net = torch.compile(cnn(), backend="eager")

    @torch.compile(backend="eager")
    def step_to(x):
        return x.to(torch.float32)

    return train(net, DataLoader(TensorDataset(xs, ys), batch_size=16), to=lambda t: step_to(t) if t.dim() == 4 else t)


PATTERNS = [
    lazy_module_to_device,
    tensor_subclass,
    dict_batches,
    namedtuple_batches,
    non_blocking_channels_last_dtype,
    iterable_with_workers,
    batch_sampler_and_collate,
    dataloader_subclass,
    autocast_and_inference_validation,
    break_and_reiterate,
    zipped_loaders,
    compiled_model,
]


def main():
    only = sys.argv[1:]
    out = {}
    for p in PATTERNS:
        if only and p.__name__ not in only:
            continue
        try:
            out[p.__name__] = [float(x).hex() for x in p()]
        except Exception as e:  # named, so the test says which pattern broke
            out[p.__name__] = f"{type(e).__name__}: {e}"
    print("RESULTS " + json.dumps(out))


if __name__ == "__main__":
    main()

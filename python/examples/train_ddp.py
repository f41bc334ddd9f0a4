"""A tiny DDP training on CPU (gloo), for `pipeprof run -- torchrun --nproc_per_node 2`.

Nothing in it knows pipeprof. `--slow-rank R --slow-ms MS` makes rank R's Dataset sleep MS
milliseconds per sample: its input pipeline is then the straggler every rank waits for.
`--data DIR` makes each sample read a file of DIR first (`sample-K.bin`, as many as there are),
as an image folder would: a node whose DIR is on slow storage feeds its ranks slowly.

    pipeprof run --once --summary d.json -- \\
        torchrun --nproc_per_node 2 python/examples/train_ddp.py --slow-rank 1
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Squares(Dataset):
    """Random 1×16×16 images, labelled by a bright square's quadrant."""

    def __init__(self, n, delay_s, root=None):
        self.n, self.delay_s = n, delay_s
        # `root`, as torchvision's folder datasets name it: where the samples are read from.
        self.root = root
        self.files = sorted(os.listdir(root)) if root else []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.files:
            with open(os.path.join(self.root, self.files[i % len(self.files)]), "rb") as f:
                f.read()
        g = torch.Generator().manual_seed(i)
        x = torch.rand(1, 16, 16, generator=g) * 0.1
        q = i % 4
        r, c = (q // 2) * 8, (q % 2) * 8
        x[0, r : r + 8, c : c + 8] += 1.0
        return x, q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--data", default=None, help="a folder whose files each sample reads first")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay = a.slow_ms / 1000 if rank == a.slow_rank else 0.0
    data = Squares(a.steps * a.batch_size * dist.get_world_size(), delay, a.data)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"rank 0 done: loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

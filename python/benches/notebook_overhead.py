"""What ``%%pipeprof`` costs a notebook cell: the same training cell run plain and under
``%%pipeprof``, alternating, in one real Jupyter kernel (nbclient), pair after pair.

    python python/benches/notebook_overhead.py --data IMAGE_FOLDER [--pairs 6]

Two cells: a PyTorch ImageFolder epoch (decode and resize on the training thread, a small CNN)
and the same for 4 epochs. Each pair runs the plain cell and the profiled one in a random order;
the wall time of each is taken around IPython's ``run_cell`` inside the kernel, so it includes
everything the magic does (the helper process started and attached, the hooks armed and taken
out, the report written and rendered as HTML). Prints per cell the median plain and profiled
times, the median of the pairs' ratios and of their differences (the fixed cost).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

SETUP = """
import json, random, time
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
torch.set_num_threads(1)
tf = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
ds = datasets.ImageFolder({data!r}, transform=tf)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def train(epochs):
    for epoch in range(epochs):
        for xs, ys in DataLoader(ds, batch_size=8, shuffle=True):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xs), ys).backward()
            opt.step()
%load_ext pipeprof
"""

MEASURE = """
ip = get_ipython()
random.seed(0)
times = {{}}
for epochs in (1, 4):
    cell = f"train({{epochs}})"
    ip.run_cell(cell)  # warm-up: imports, first-use caches, both ways
    ip.run_cell("%%pipeprof --no-gpu\\n" + cell)
    pairs = []
    for _ in range({pairs}):
        took = {{}}
        for kind in random.sample(["plain", "pipeprof"], 2):
            source = cell if kind == "plain" else "%%pipeprof --no-gpu\\n" + cell
            t0 = time.perf_counter()
            ip.run_cell(source)
            took[kind] = time.perf_counter() - t0
        pairs.append(took)
    times[epochs] = pairs
print("TIMES " + json.dumps(times))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--pairs", type=int, default=6)
    args = ap.parse_args()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(SETUP.format(data=args.data)), nbformat.v4.new_code_cell(MEASURE.format(pairs=args.pairs))]
    )
    with tempfile.TemporaryDirectory() as run:
        env = dict(os.environ, XDG_RUNTIME_DIR=run, OMP_NUM_THREADS="1")
        NotebookClient(nb, timeout=3600, kernel_name="python3").execute(env=env)
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    times = json.loads(next(line for line in text.splitlines() if line.startswith("TIMES "))[6:])
    for epochs, pairs in times.items():
        plain = [p["plain"] for p in pairs]
        prof = [p["pipeprof"] for p in pairs]
        ratios = [p["pipeprof"] / p["plain"] for p in pairs]
        fixed = [p["pipeprof"] - p["plain"] for p in pairs]
        print(
            f"{epochs} epoch(s): plain {statistics.median(plain):.3f} s, %%pipeprof {statistics.median(prof):.3f} s; "
            f"ratio median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); "
            f"added {statistics.median(fixed):.3f} s median over {len(pairs)} pairs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each of `pipeprof run`'s PyTorch hooks costs the training thread, measured inside one
process: the MNIST-sized MLP of python/examples/mlp_in_memory.py (784-128-10, batch 32,
in-memory TensorDataset, num_workers=0, one compute thread: steps of about 1 ms) trains under
`pipeprof run` while the hooks are switched off and on between short runs of steps, arm after
arm, round after round, all on one DataLoader iterator: the machine's load drifts over every
arm alike, which a comparison of whole processes (python/benches/tiny_step.py) cannot give at
the microsecond scale.

    python python/benches/hook_cost.py [--rounds 300] [--steps 32] [--pipeprof PATH]

Arms: `none` (no hook: the baseline), `all` (every hook, as `pipeprof run` installs them),
`loop` (DataLoader `__iter__`/`__next__` alone: the steps), `fetch` (the batch's fetch and
collate, alone), and `loop+backward` (`torch.autograd.backward`: the loss) and
`loop+optimizer` (torch's global optimizer step hooks): those two are put in place by the
loop on its sampled steps only (one in `LOSS_EVERY`), so they are measured with it; their own
cost is their arm's less `loop`'s. `none again`, a second baseline, shows the method's own
error. A hook alone is not quite its share of `all` (without the loop no step is open, and a
batch's spans go alone instead of with its step).
The arms run in a new random order each round. Prints per arm the median training-thread CPU
time per step (`time.thread_time`: the thread's own cost, whatever the other processes do),
the cost over `none` in µs (the median of each round's difference to that round's `none`),
its quartiles and share of the step, and the p10 cost (the arm's 10th percentile less
`none`'s: the other processes only ever add time, and least to the fastest rounds).
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

ARMS = {
    "none": (),
    # The same as `none`: the method's own error (its cost should read about 0).
    "none again": (),
    "all": ("loop", "fetch", "backward", "optimizer"),
    "loop": ("loop",),
    "fetch": ("fetch",),
    "loop+backward": ("loop", "backward"),
    "loop+optimizer": ("loop", "optimizer"),
}


def hooks():
    """A function that puts the hooks named in place and takes the others out."""
    import torch.utils.data._utils.fetch as fetch
    import torch.utils.data.dataloader as dataloader

    from pipeprof._state import TORCH

    it = dataloader.DataLoader.__iter__
    loop = TORCH.loop
    installed = (loop, TORCH.backward, TORCH.optimizer, TORCH.next_hook, TORCH.fetch_hook)
    if not hasattr(it, "__wrapped__") or None in installed:
        raise SystemExit("the PyTorch hooks are not installed: run this under `pipeprof run`")

    def put(on):
        dataloader.DataLoader.__iter__ = it if "loop" in on else it.__wrapped__
        dataloader._BaseDataLoaderIter.__next__ = TORCH.next_hook if "loop" in on else TORCH.next_orig
        fetch._MapDatasetFetcher.fetch = TORCH.fetch_hook if "fetch" in on else TORCH.fetch_orig
        # The loop puts these two in place on its sampled steps, as far as they are enabled.
        loop.enable_hooks("backward" in on, "optimizer" in on)

    return put


def measure(args):
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    put = hooks()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    xs, ys = torch.rand(args.samples, 784), torch.randint(0, 10, (args.samples,))
    loader = DataLoader(TensorDataset(xs, ys), batch_size=args.batch_size, shuffle=True)
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    cpu = {k: [] for k in ARMS}
    order = list(ARMS)
    rng = random.Random(0)

    def batches():
        # One pass after another: the arms take turns inside a pass, so no arm pays more
        # passes' starts (the sampler's permutation) than another.
        while True:
            yield from loader

    stream = batches()
    for _ in range(args.rounds):
        # A new order each round: no arm always follows the same one.
        rng.shuffle(order)
        for arm in order:
            put(ARMS[arm])
            c0 = time.thread_time_ns()
            for _, (x, y) in zip(range(args.steps), stream):
                opt.zero_grad()
                loss = loss_fn(net(x), y)
                loss.backward()
                opt.step()
            cpu[arm].append((time.thread_time_ns() - c0) / args.steps / 1000)
    put(ARMS["all"])
    base = statistics.median(cpu["none"])
    low = {arm: statistics.quantiles(xs, n=10)[0] for arm, xs in cpu.items()}
    print(f"{'arm':<11} {'µs/step':>8} {'cost µs':>8} {'q1–q3':>13} {'share':>7} {'p10 cost':>9}")
    for arm, xs in cpu.items():
        # The cost: each round's difference to the same round's `none`, so drift between
        # rounds cancels; its median and quartiles. The p10 cost compares the arms' fastest
        # tenth instead: the other processes only ever add time, and least to those.
        diff = [a - b for a, b in zip(xs, cpu["none"])]
        q = statistics.quantiles(diff)
        cost = statistics.median(diff)
        print(
            f"{arm:<11} {statistics.median(xs):>8.1f} {cost:>8.1f} {q[0]:>6.1f}–{q[2]:<6.1f} {cost / base:>7.1%} "
            f"{low[arm] - low['none']:>9.1f}"
        )
    print(
        f"(training-thread CPU per step: medians of {args.rounds} rounds of {args.steps} steps per arm, the cost paired with "
        f"the round's `none`; p10 cost: the arm's 10th percentile less `none`'s; batch {args.batch_size})"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=32768)
    p.add_argument("--pipeprof", default=shutil.which("pipeprof"))
    args = p.parse_args()
    if os.environ.get("PIPEPROF_HOOK_COST") == "1":
        return measure(args)
    if not args.pipeprof:
        raise SystemExit("no pipeprof command: install the wheel or pass --pipeprof")
    env = {**os.environ, "PIPEPROF_HOOK_COST": "1"}
    cmd = [args.pipeprof, "run", "--once", "--no-gpu", "--", sys.executable, *sys.argv]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()

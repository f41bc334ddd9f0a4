"""What `pipeprof run` costs a training loop whose step is tiny: the MNIST-sized MLP of
python/examples/mlp_in_memory.py (784-128-10, batch 32, an in-memory TensorDataset,
num_workers=0, one compute thread on the CPU: steps of about 1 ms), plain and under
`pipeprof run`, alternating (plain, profiled, plain, …) so the machine's load drifts over both
alike.

    python python/benches/tiny_step.py [--rounds 7] [--pipeprof PATH]

Prints each side's median images/s (min–max), the ratio, and the cost per step in µs:
(1 / profiled − 1 / plain) × batch, from the medians, and as a share of the plain step.
The script's own images/s count from its loop's start, so Python's and torch's start-up are
left out of both sides.
"""

import argparse
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "mlp_in_memory.py"


def images_per_s(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"images in [0-9.]+ s: ([0-9.]+) images/s", out)
    if not m:
        raise SystemExit(f"no images/s in the output of {cmd}:\n{out}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=32768)
    p.add_argument("--pipeprof", default=shutil.which("pipeprof"))
    args = p.parse_args()
    if not args.pipeprof:
        raise SystemExit("no pipeprof command: install the wheel or pass --pipeprof")
    script = [
        sys.executable, str(SCRIPT), "--batch-size", str(args.batch_size), "--samples", str(args.samples),
        "--epochs", "2", "--threads", "1",
    ]
    plain, run = [], []
    for _ in range(args.rounds):
        plain.append(images_per_s(script))
        run.append(images_per_s([args.pipeprof, "run", "--once", "--no-gpu", "--", *script]))
    mp, mr = statistics.median(plain), statistics.median(run)
    step_plain_us = args.batch_size / mp * 1e6
    cost_us = (1 / mr - 1 / mp) * args.batch_size * 1e6
    print(f"{'plain img/s':>22} {'pipeprof run img/s':>22} {'ratio':>7} {'step µs':>8} {'cost µs/step':>13} {'share':>7}")
    print(
        f"{mp:>10.0f} ({min(plain):.0f}–{max(plain):.0f}) {mr:>10.0f} ({min(run):.0f}–{max(run):.0f}) "
        f"{mr / mp:>7.3f} {step_plain_us:>8.0f} {cost_us:>13.1f} {cost_us / step_plain_us:>7.1%}"
    )
    print(f"(medians of {args.rounds} alternating rounds; batch {args.batch_size}, {args.samples} samples × 2 epochs)")


if __name__ == "__main__":
    main()

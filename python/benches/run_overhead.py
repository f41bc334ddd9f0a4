"""What `pipeprof run` costs an unmodified PyTorch training script: images/s with and without
it, on the same data, alternating runs (plain, profiled, plain, …) so that the machine's load
drifts over both alike.

    python python/benches/run_overhead.py --data /tmp/pp-imgs [--rounds 5] [--pipeprof PATH]

The script is python/examples/train_torchvision.py on the CPU (one compute thread, as the
loader workers need the other cores); its own images/s count from the first batch on, so
Python's and the framework's start-up are left out of both. Prints the median of each side,
its spread, and the ratio, for num_workers 0 and 2.
"""

import argparse
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parent / "examples" / "train_torchvision.py"


def images_per_s(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"done: \d+ steps, ([0-9.]+) images/s", out)
    if not m:
        raise SystemExit(f"no images/s in the output of {cmd}:\n{out}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--pipeprof", default=shutil.which("pipeprof"))
    args = p.parse_args()
    if not args.pipeprof:
        raise SystemExit("no pipeprof command: install the wheel or pass --pipeprof")
    print(f"{'num_workers':>11} {'plain img/s':>14} {'pipeprof run':>14} {'ratio':>7}  (median, min–max of {args.rounds})")
    for workers in (0, 2):
        script = [sys.executable, str(SCRIPT), "--data", args.data, "--workers", str(workers), "--epochs", str(args.epochs), "--threads", "1"]
        plain, run = [], []
        for _ in range(args.rounds):
            plain.append(images_per_s(script))
            run.append(images_per_s([args.pipeprof, "run", "--once", "--no-gpu", "--", *script]))
        mp, mr = statistics.median(plain), statistics.median(run)
        print(
            f"{workers:>11} {mp:>8.1f} ({min(plain):.0f}–{max(plain):.0f}) {mr:>6.1f} ({min(run):.0f}–{max(run):.0f}) {mr / mp:>7.3f}"
        )


if __name__ == "__main__":
    main()

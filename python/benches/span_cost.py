"""Per-span cost from Python: what `with pipeprof.span(...)` adds to a loop.

    python python/benches/span_cost.py [--spans N] [--rounds R]

Each round times N empty `with` blocks of three kinds, in alternating order: a plain
Python context manager (the floor any `with` pays), a `decode` span (CPU-timed: two thread
CPU clock reads), and a `wait` span (not CPU-timed). The figures are medians over rounds,
in ns per span, with the plain context manager subtracted, as the calling thread's CPU
time (what the loop pays; fair on a shared machine) and as wall time. The server runs, no viewer is
attached (the program pays the Layer and channel, not the encoding).
"""

import argparse
import statistics
import time

import pipeprof


class Plain:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def per_span_ns(make, n):
    """(wall ns, this thread's CPU ns) per span. On a machine shared with other work the
    CPU figure is the one to read: wall time also counts the time other processes held
    the core."""
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for i in range(n):
        with make(i):
            pass
    return (time.perf_counter_ns() - w0) / n, (time.thread_time_ns() - c0) / n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--spans", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    pipeprof.init(program="span-cost-bench", sample=False)
    kinds = {
        "plain with": lambda i: Plain(),
        "span decode (cpu-timed)": lambda i: pipeprof.span("decode", sample=i),
        "span wait": lambda i: pipeprof.span("wait", step=i),
    }
    per_span_ns(kinds["span decode (cpu-timed)"], 10_000)  # warm-up: thread setup, caches
    results = {k: [] for k in kinds}
    for r in range(a.rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            results[k].append(per_span_ns(kinds[k], a.spans))
    print(f"{a.rounds} rounds x {a.spans} spans; medians, ns per span (spread = min..max)")
    for what, idx in (("thread CPU time", 1), ("wall time", 0)):
        floor = statistics.median(v[idx] for v in results["plain with"])
        print(f"{what}:")
        for k, v in results.items():
            xs = [x[idx] for x in v]
            med = statistics.median(xs)
            extra = "" if k == "plain with" else f"  -> {med - floor:6.0f} ns over a plain with"
            print(f"  {k:<26} {med:6.0f}  ({min(xs):.0f}..{max(xs):.0f}){extra}")
    print(f"dropped events: {pipeprof.dropped()}")
    pipeprof.finish()


if __name__ == "__main__":
    main()

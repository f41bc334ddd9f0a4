"""A plain numpy + Pillow training loop, instrumented for `pipeprof attach`.

    cargo run --release -- demo-data /tmp/pp-imgs
    pip install ./python numpy pillow
    python python/examples/train_numpy.py --data /tmp/pp-imgs --workers 2     # terminal 1
    cargo run --release -- attach                                            # terminal 2

The Python twin of examples/train_cnn.rs: `pipeprof.init(..)` once, spans named after the
stages where the work happens, `pipeprof.step(..)` after each step. The loader runs in
worker processes (multiprocessing, like a PyTorch DataLoader with num_workers): their
read/decode/resize spans reach this process's run on their own. The model is softmax
regression on the pixels, trained with plain SGD.
"""

import argparse
import io
import multiprocessing as mp
import os
import queue
import sys

import numpy as np
from PIL import Image

import pipeprof

EXTENSIONS = (".jpg", ".jpeg", ".png")
#: Batches the loader may have ready ahead of the training loop.
PREFETCH = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="an ImageFolder: DIR/<class>/<image>")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--workers", type=int, default=2, help="loader worker processes")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=32, help="images are resized to SIZE x SIZE")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None)
    p.add_argument("--wait-for-clients", type=int, default=0, help="start training once N viewers attached")
    a = p.parse_args(argv)
    if a.workers < 1 or a.batch_size < 1 or a.size < 1 or a.steps < 0:
        p.error("--workers, --batch-size and --size must be at least 1, --steps at least 0")
    return a


def scan(root):
    """(path, label) for every image, and the class names in sorted folder order."""
    try:
        classes = sorted(e.path for e in os.scandir(root) if e.is_dir())
    except OSError as e:
        sys.exit(f"error: {root}: {e}")
    files = []
    for label, d in enumerate(classes):
        for e in os.scandir(d):
            if e.name.lower().endswith(EXTENSIONS):
                files.append((e.path, label))
    files.sort()
    return files, [os.path.basename(c) for c in classes]


def load(path, size, index):
    with pipeprof.span("read", sample=index):
        with open(path, "rb") as f:
            data = f.read()
    with pipeprof.span("decode", sample=index):
        img = Image.open(io.BytesIO(data)).convert("RGB")
    with pipeprof.span("resize", sample=index):
        small = img.resize((size, size), Image.BILINEAR)
        return np.asarray(small, dtype=np.float32).transpose(2, 0, 1) / 255.0


def put_while_parent_lives(out, item, parent):
    """Blocks on a full queue only while the training process is alive: a killed trainer
    must not leave its workers waiting forever."""
    while True:
        try:
            out.put(item, timeout=0.5)
            return True
        except queue.Full:
            if os.getppid() != parent:
                # Batches still buffered for the dead trainer would hold this process at
                # exit (the queue's feeder thread is joined then): drop them.
                out.cancel_join_thread()
                return False


def loader_worker(files, batch, size, steps, next_batch, out, parent):
    """Takes batch numbers from a shared counter, sends whole batches."""
    while True:
        with next_batch.get_lock():
            b = next_batch.value
            next_batch.value += 1
        if b >= steps:
            return
        xs, ys = [], []
        for k in range(batch):
            i = (b * batch + k) % len(files)
            path, label = files[i]
            try:
                xs.append(load(path, size, i))
                ys.append(label)
            except OSError:
                continue
        xs = np.stack(xs) if xs else np.zeros((0, 3, size, size), np.float32)
        if not put_while_parent_lives(out, (xs, np.array(ys, np.int64)), parent):
            return


def next_batch_or_none(q, workers):
    """The next batch; None once every worker has exited and the queue is empty."""
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            if not any(w.is_alive() for w in workers):
                return None


def main(argv=None):
    a = parse_args(argv)
    files, classes = scan(a.data)
    if not files:
        sys.exit(f"error: no images under {a.data} (an ImageFolder: DIR/<class>/<image>)")
    ctx = mp.get_context(a.start_method)
    addr = pipeprof.init(
        program="train_numpy",
        settings={
            "model": "python/examples/train_numpy.py",
            "data": os.path.abspath(a.data),
            "images": len(files),
            "classes": classes,
            "workers": a.workers,
            "prefetch": PREFETCH,
            "batch_size": a.batch_size,
            "device": "cpu",
            "input": [3, a.size, a.size],
            "cores": os.cpu_count() or 1,
        },
    )
    # The address goes to stdout first thing, so scripts (and tests) can attach to it.
    print(f"attach: {addr}", flush=True)
    if a.wait_for_clients > 0:
        pipeprof.wait_for_clients(a.wait_for_clients)

    next_batch = ctx.Value("q", 0)
    batches = ctx.Queue(maxsize=PREFETCH)
    workers = [
        ctx.Process(
            target=loader_worker,
            args=(files, a.batch_size, a.size, a.steps, next_batch, batches, os.getpid()),
            name=f"loader-{w}",
            daemon=True,
        )
        for w in range(a.workers)
    ]
    for w in workers:
        w.start()

    rng = np.random.default_rng(0)
    n_in = 3 * a.size * a.size
    weights = (rng.standard_normal((n_in, len(classes))) * 0.01).astype(np.float32)
    bias = np.zeros(len(classes), np.float32)
    images_per_epoch = len(files)
    for step in range(a.steps):
        queued = batches.qsize()
        with pipeprof.span("wait", step=step):
            got = next_batch_or_none(batches, workers)
        if got is None:
            break
        xs, ys = got
        n = len(ys)
        if n == 0:
            continue
        with pipeprof.span("transfer", step=step):
            # Host batch to the model's layout: the numpy "device" is a contiguous matrix.
            xs = np.ascontiguousarray(xs.reshape(n, n_in))
        with pipeprof.span("compute", step=step):
            with pipeprof.span("forward", step=step):
                logits = xs @ weights + bias
                logits -= logits.max(axis=1, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=1, keepdims=True)
                loss = float(-np.log(p[np.arange(n), ys] + 1e-9).mean())
            with pipeprof.span("backward", step=step):
                g = p
                g[np.arange(n), ys] -= 1.0
                g /= n
                grad_w = xs.T @ g
                grad_b = g.sum(axis=0)
            with pipeprof.span("optimizer", step=step):
                weights -= a.lr * grad_w
                bias -= a.lr * grad_b
            correct = int((logits.argmax(axis=1) == ys).sum())
        pipeprof.step(
            step,
            epoch=step * a.batch_size // images_per_epoch,
            images=n,
            loss=loss,
            correct=correct,
            queued=queued,
        )
        if step % 50 == 0:
            print(f"step {step}: loss {loss:.4f}", file=sys.stderr)
    for w in workers:
        w.join(timeout=5)
        if w.is_alive():
            w.terminate()
    pipeprof.finish()


if __name__ == "__main__":
    main()

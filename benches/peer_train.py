#!/usr/bin/env python3
"""The PyTorch CPU peer for `cargo bench --bench train`: the model of a cnn.toml built with
torch.nn, trained on random data, each phase timed as pipeprof times it (forward = forward +
cross-entropy, backward = loss.backward(), optimizer = step + zero_grad).

Usage: peer_train.py MODEL.toml CLASSES BATCH THREADS [DEVICE]. DEVICE (default cpu) may be
cuda (`cargo bench --features cuda --bench cuda_step`): model and data on the GPU, and the
device synchronised after each phase so that each time is device time. Builds the model once, then reads one
line per round from stdin ("N": run N steps; nothing: exit) and answers with one line of
medians in ms: "forward backward optimizer step". The bench alternates rounds of this
process with rounds of its own, so both see the same machine.
"""
import sys
import time
import tomllib

import torch
from torch import nn


def same_pad(size, k, s):
    # Keras/TensorFlow "same": output ceil(size / s), the odd pixel at the end.
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def build(cfg, classes):
    c, h, w = cfg["input"]["channels"], cfg["input"]["height"], cfg["input"]["width"]
    layers, shape = [], [c, h, w]
    spec = cfg["layers"]
    acts = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU}
    for i, l in enumerate(spec):
        t = l["type"]
        act = l.get("activation", "linear")
        if t == "conv2d":
            k, s = l["kernel_size"], l.get("strides", 1)
            if l.get("padding", "valid") == "same":
                top, bottom = same_pad(shape[1], k, s)
                left, right = same_pad(shape[2], k, s)
                layers.append(nn.ZeroPad2d((left, right, top, bottom)))
                shape = [shape[0], shape[1] + top + bottom, shape[2] + left + right]
            layers.append(nn.Conv2d(shape[0], l["filters"], k, stride=s))
            shape = [l["filters"], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif t in ("max_pooling2d", "average_pooling2d"):
            k = l["pool_size"]
            s = l.get("strides", k)
            layers.append((nn.MaxPool2d if t == "max_pooling2d" else nn.AvgPool2d)(k, s))
            shape = [shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1]
        elif t == "flatten":
            layers.append(nn.Flatten())
            shape = [shape[0] * shape[1] * shape[2]]
        elif t == "dense":
            out = classes if l["units"] == "classes" else l["units"]
            layers.append(nn.Linear(shape[0], out))
            shape = [out]
        elif t == "dropout":
            layers.append(nn.Dropout(l["rate"]))
        else:
            sys.exit(f"peer_train.py: unknown layer type {t}")
        last = i == len(spec) - 1
        if act == "softmax" and not last:
            layers.append(nn.Softmax(dim=-1))
        elif act in acts:
            layers.append(acts[act]())
    return nn.Sequential(*layers), (c, h, w)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    path, classes, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    device = torch.device(sys.argv[5] if len(sys.argv) > 5 else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(threads)
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    model, (c, h, w) = build(cfg, classes)
    model = model.to(device)
    train = cfg.get("train", {})
    lr = train.get("learning_rate", 0.001)
    kind = train.get("optimizer", "adam")
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    elif kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    xs = torch.rand((batch, c, h, w), generator=g)
    ys = torch.randint(0, classes, (batch,), generator=g)
    xs, ys = xs.to(device), ys.to(device)
    loss_fn = nn.CrossEntropyLoss()
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        fwd, bwd, opt_ms, step = [], [], [], []
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            loss = loss_fn(model(xs), ys)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            t3 = time.perf_counter()
            loss.item()
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            opt_ms.append((t3 - t2) * 1e3)
            step.append((t3 - t0) * 1e3)
        print(median(fwd), median(bwd), median(opt_ms), median(step), flush=True)


if __name__ == "__main__":
    main()

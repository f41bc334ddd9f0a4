# corpus: python=torch steps=12
"""An image classifier with fastai, as its vision tutorials train one: a `DataBlock` of
`ImageBlock` and `CategoryBlock` over an image folder (`get_image_files`, `parent_label`), each
picture opened and decoded by `PILImage.create` and resized by `Resize` per item, `dataloaders`
with fastai's own `DataLoader` (a `TfmdDL`: its workers run inside a torch iterator it makes
itself), a look at one batch (`dls.one_batch()`), `vision_learner` on a resnet with random
weights, and `learn.fit`, whose validation pass runs under `torch.no_grad()`. The folder is generated (corpus/_data.py) unless --data names
one; nothing is downloaded. A callback of the script's own counts the optimizer's steps, the
images trained on and the validation batches, keeps each step's loss and times each epoch;
they are printed last, with the losses' range and the script's own peak memory (`getrusage`).

    python fastai_datablock.py --epochs 2 --num-workers 2
"""

import argparse
import os
import resource
import time

import _data
from fastai.vision.all import (
    Callback,
    CategoryBlock,
    DataBlock,
    ImageBlock,
    RandomSubsetSplitter,
    Resize,
    accuracy,
    get_image_files,
    parent_label,
    resnet18,
    set_seed,
    vision_learner,
)


class CountSteps(Callback):
    """The script's own counters: optimizer steps and their images, validation batches, and
    each epoch's time (its training and validation passes)."""

    order = 90

    def before_fit(self):
        self.train_steps = self.train_images = self.valid_batches = 0
        self.epoch_s, self.losses = [], []

    def before_epoch(self):
        self.t_epoch = time.perf_counter()

    def after_step(self):
        # Called after the optimizer's step: training batches only.
        self.train_steps += 1
        self.train_images += len(self.learn.yb[0])
        self.losses.append(self.learn.loss.item())

    def after_batch(self):
        if not self.training:
            self.valid_batches += 1

    def after_epoch(self):
        self.epoch_s.append(time.perf_counter() - self.t_epoch)


def main():
    p = argparse.ArgumentParser(description="fastai DataBlock + vision_learner, random weights")
    p.add_argument("--data", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--bs", type=int, default=16)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--train-pct", type=float, default=0.25, help="share of the pictures trained on")
    p.add_argument("--valid-pct", type=float, default=0.1)
    p.add_argument("--num-workers", type=int, default=os.cpu_count())
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    set_seed(args.seed)

    path = args.data or _data.image_folder()
    dblock = DataBlock(
        blocks=(ImageBlock, CategoryBlock),
        get_items=get_image_files,
        splitter=RandomSubsetSplitter(train_sz=args.train_pct, valid_sz=args.valid_pct, seed=args.seed),
        get_y=parent_label,
        item_tfms=Resize(args.size),
    )
    dls = dblock.dataloaders(path, bs=args.bs, num_workers=args.num_workers)
    xb, yb = dls.one_batch()
    print(f"a batch: images {tuple(xb.shape)}, labels {tuple(yb.shape)}, classes {dls.vocab}")
    counter = CountSteps()
    learn = vision_learner(dls, resnet18, pretrained=False, metrics=accuracy, cbs=counter)
    with learn.no_bar():
        learn.fit(args.epochs, args.lr)

    valid_loss, acc = learn.recorder.values[-1][1:3]
    epochs = " ".join(f"{s:.3f}" for s in counter.epoch_s)
    print(
        f"counted: train_steps={counter.train_steps} train_images={counter.train_images} "
        f"valid_batches={counter.valid_batches} batch_size={args.bs} num_workers={args.num_workers} "
        f"loss_min={min(counter.losses):.4f} loss_max={max(counter.losses):.4f} "
        f"maxrss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} "
        f"epoch_s={','.join(f'{s:.3f}' for s in counter.epoch_s)}"
    )
    print(f"epoch_s: {epochs}")
    print(f"valid_loss {valid_loss:.4f} accuracy {100 * acc:.2f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()

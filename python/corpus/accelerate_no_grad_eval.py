# corpus: python=torch steps=12
"""An 🤗 accelerate image classifier, as accelerate's cv_example trains one: a Dataset that
opens each picture with PIL and returns a dict ({"image", "label"}), DataLoaders given to
`accelerator.prepare` (its DataLoaderShard reads one batch ahead), `accelerator.backward`, and
an eval loop whose `torch.no_grad()` wraps the forward pass only, not the `next()`. The folder
is generated (corpus/_data.py) unless --data names one. The script counts its own training
steps and images and its eval batches and images, and prints them last.

    python accelerate_no_grad_eval.py --epochs 3
"""

import argparse
import os
import time

import _data
import torch
from accelerate import Accelerator
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class PicturesDataset(Dataset):
    """Files and labels, each picture opened and transformed per item, as a dict."""

    def __init__(self, files, labels, transform):
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        image = Image.open(self.files[idx]).convert("RGB")
        return {"image": self.transform(image), "label": self.labels[idx]}


def listing(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files, labels = [], []
    for i, c in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(root, c))):
            files.append(os.path.join(root, c, name))
            labels.append(i)
    return files, labels, classes


class SmallNet(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(32 * 16, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def main():
    p = argparse.ArgumentParser(description="accelerate, eval under no_grad around the forward only")
    p.add_argument("--data", default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument("--train-size", type=int, default=100, help="pictures to train on (a partial last batch)")
    p.add_argument("--eval-size", type=int, default=40)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    accelerator = Accelerator(cpu=True)

    files, labels, classes = listing(args.data or _data.image_folder())
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(args.seed)).tolist()
    train_idx = order[: args.train_size]
    eval_idx = order[args.train_size : args.train_size + args.eval_size]
    mean, std = torch.tensor([0.5, 0.5, 0.5])[:, None, None], torch.tensor([0.25, 0.25, 0.25])[:, None, None]
    tf = transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()])
    train_ds = PicturesDataset([files[i] for i in train_idx], [labels[i] for i in train_idx], tf)
    eval_ds = PicturesDataset([files[i] for i in eval_idx], [labels[i] for i in eval_idx], tf)
    train_dataloader = DataLoader(train_ds, shuffle=True, batch_size=args.batch_size, num_workers=args.num_workers)
    eval_dataloader = DataLoader(eval_ds, shuffle=False, batch_size=args.eval_batch_size, num_workers=args.num_workers)

    model = SmallNet(len(classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, epochs=args.epochs, steps_per_epoch=len(train_dataloader)
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    train_steps = train_images = eval_batches = eval_images = 0
    body_s, epoch_s = [], []
    for epoch in range(args.epochs):
        epoch_t0 = time.perf_counter()  # the epoch: its training pass and its eval pass
        model.train()
        for step, batch in enumerate(train_dataloader):
            t0 = time.perf_counter()
            inputs = (batch["image"] - mean) / std
            outputs = model(inputs)
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            body_s.append(time.perf_counter() - t0)
            train_steps += 1
            train_images += len(batch["label"])

        model.eval()
        accurate = num_elems = 0
        for step, batch in enumerate(eval_dataloader):
            inputs = (batch["image"] - mean) / std
            with torch.no_grad():
                outputs = model(inputs)
            predictions = outputs.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["label"]))
            accurate_preds = predictions == references
            num_elems += accurate_preds.shape[0]
            accurate += accurate_preds.long().sum().item()
            eval_batches += 1
            eval_images += len(batch["label"])
        epoch_s.append(time.perf_counter() - epoch_t0)
        accelerator.print(f"epoch {epoch}: {100 * accurate / num_elems:.2f}")

    body_s.sort()
    accelerator.print(
        f"counted: train_steps={train_steps} train_images={train_images} eval_batches={eval_batches} "
        f"eval_images={eval_images} batch_size={args.batch_size} body_p50_ms={1e3 * body_s[(len(body_s) - 1) // 2]:.3f} "
        f"epoch_s={','.join(f'{s:.3f}' for s in epoch_s)}"
    )
    accelerator.print(f"accuracy {100 * accurate / num_elems:.2f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()

# corpus: python=torch steps=12
"""An image classifier on a 🤗 `datasets` imagefolder, as the 🤗 image classification example
prepares one: `load_dataset("imagefolder")`, its `Image` feature decoding each row (PIL, inside
`Dataset.__getitems__`, one call for the batch), `with_transform` running a torchvision
`Compose` per example, a `collate_fn` that stacks `pixel_values`; 0 workers, the CPU, and an
eval loop whose `torch.no_grad()` wraps the forward pass only. The folder is generated
(corpus/_data.py) unless --data names one; nothing is downloaded. The script counts its own
training steps and images, its eval batches and images, and its own training rate (images/s
of the training loops after the first epoch), and prints them last.

    python hf_datasets_imagefolder.py --epochs 2
"""

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import _data  # noqa: E402
import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchvision.transforms import (  # noqa: E402
    CenterCrop,
    Compose,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
)


class SmallNet(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(32 * 4, classes)

    def forward(self, pixel_values):
        return self.head(torch.flatten(self.features(pixel_values), 1))


def main():
    p = argparse.ArgumentParser(description="🤗 datasets imagefolder, with_transform")
    p.add_argument("--data", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--train-size", type=int, default=120)
    p.add_argument("--eval-size", type=int, default=40)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    torch.manual_seed(args.seed)

    data_dir = args.data or _data.image_folder()
    cache_dir = os.path.join(os.path.dirname(os.path.abspath(data_dir)), "hf-datasets-cache")
    dataset = load_dataset("imagefolder", data_dir=data_dir, cache_dir=cache_dir)
    split = dataset["train"].shuffle(seed=args.seed).select(range(args.train_size + args.eval_size))
    split = split.train_test_split(test_size=args.eval_size, seed=args.seed)
    labels = dataset["train"].features["label"].names

    normalize = Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    train_transforms = Compose([RandomResizedCrop(args.size), RandomHorizontalFlip(), ToTensor(), normalize])
    val_transforms = Compose([Resize(args.size), CenterCrop(args.size), ToTensor(), normalize])

    def preprocess_train(example_batch):
        example_batch["pixel_values"] = [train_transforms(image.convert("RGB")) for image in example_batch["image"]]
        return example_batch

    def preprocess_val(example_batch):
        example_batch["pixel_values"] = [val_transforms(image.convert("RGB")) for image in example_batch["image"]]
        return example_batch

    train_dataset = split["train"].with_transform(preprocess_train)
    eval_dataset = split["test"].with_transform(preprocess_val)

    def collate_fn(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["label"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    train_dataloader = DataLoader(
        train_dataset, shuffle=True, collate_fn=collate_fn, batch_size=args.batch_size, num_workers=args.num_workers
    )
    eval_dataloader = DataLoader(eval_dataset, collate_fn=collate_fn, batch_size=args.batch_size)

    model = SmallNet(len(labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_steps = train_images = eval_batches = eval_images = 0
    clock_s = clock_images = 0.0
    epoch_s = []
    for epoch in range(args.epochs):
        epoch_t0 = time.perf_counter()  # the epoch: its training pass and its eval pass
        model.train()
        started, images_before = time.perf_counter(), train_images
        for step, batch in enumerate(train_dataloader):
            outputs = model(batch["pixel_values"])
            loss = nn.functional.cross_entropy(outputs, batch["labels"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            train_steps += 1
            train_images += len(batch["labels"])
        # The first epoch warms up (allocator, kernels) unless it is the only one.
        if epoch > 0 or args.epochs == 1:
            clock_s += time.perf_counter() - started
            clock_images += train_images - images_before
        model.eval()
        correct = seen = 0
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(batch["pixel_values"])
            correct += (outputs.argmax(-1) == batch["labels"]).sum().item()
            seen += len(batch["labels"])
            eval_batches += 1
            eval_images += len(batch["labels"])
        epoch_s.append(time.perf_counter() - epoch_t0)
        print(f"epoch {epoch}: accuracy {100 * correct / seen:.2f}")
    print(
        f"counted: train_steps={train_steps} train_images={train_images} eval_batches={eval_batches} "
        f"eval_images={eval_images} batch_size={args.batch_size} train_images_per_s={clock_images / clock_s:.2f} "
        f"epoch_s={','.join(f'{s:.3f}' for s in epoch_s)}"
    )
    print(f"accuracy {100 * correct / seen:.2f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()

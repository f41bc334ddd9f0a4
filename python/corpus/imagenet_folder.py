# corpus: python=torch steps=24
"""An ImageNet-style training script, as the PyTorch ImageNet example writes it: an ImageFolder,
RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize, `-j` workers, pin_memory, a
ResNet-shaped model (small here, so that it runs on a CPU), SGD with momentum. The folder is
generated (corpus/_data.py) unless --data names one.

    python imagenet_folder.py -j 4 --epochs 6
"""

import argparse
import time

import _data
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def tiny_resnet(num_classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        BasicBlock(16, 16, 1),
        BasicBlock(16, 32, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def main():
    p = argparse.ArgumentParser(description="ImageNet-style training")
    p.add_argument("--data", default=None, help="an ImageFolder (default: generated)")
    p.add_argument("-j", "--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--crop", type=int, default=64)
    p.add_argument("--print-freq", type=int, default=10)
    p.add_argument("--limit-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        args.data or str(_data.image_folder()),
        transforms.Compose(
            [
                transforms.RandomResizedCrop(args.crop),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    train_loader = DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True
    )
    model = tiny_resnet(len(train_dataset.classes)).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        seen, correct, total_loss = 0, 0, 0.0
        for i, (images, target) in enumerate(train_loader):
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(target)
            correct += (output.argmax(1) == target).sum().item()
            total_loss += loss.item() * len(target)
            if i % args.print_freq == 0:
                print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tTime {time.time() - end:.3f}\tLoss {loss.item():.4f}")
            end = time.time()
            if args.limit_batches and i + 1 >= args.limit_batches:
                break
    print(f" * Loss {total_loss / seen:.4f} Acc@1 {100.0 * correct / seen:.3f}")


if __name__ == "__main__":
    main()

# corpus: python=torch steps=300
"""MNIST in memory, as the PyTorch MNIST example trains it: a torchvision-style Dataset that holds
uint8 28×28 images and, per item, makes a PIL image and runs ToTensor + Normalize; no workers,
a small batch, the CPU. The images are generated (corpus/_data.py), not downloaded.

    python mnist_in_memory.py --epochs 2
"""

import argparse

import _data
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class MNISTLike(Dataset):
    """What torchvision.datasets.MNIST is once loaded: tensors in memory, PIL per item."""

    def __init__(self, train=True, transform=None):
        n, seed = (6000, 0) if train else (1000, 1)
        images, labels = _data.mnist_like(n, seed)
        self.data, self.targets = torch.from_numpy(images), torch.from_numpy(labels)
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        img, target = self.data[index], int(self.targets[index])
        # As torchvision's MNIST does: a PIL image, so that every transform sees one.
        img = Image.fromarray(img.numpy(), mode="L")
        if self.transform is not None:
            img = self.transform(img)
        return img, target


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}")
        if args.limit_batches and batch_idx + 1 >= args.limit_batches:
            break


def test(model, device, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)")


def main():
    p = argparse.ArgumentParser(description="MNIST-like, in memory")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--limit-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = MNISTLike(train=True, transform=transform)
    test_set = MNISTLike(train=False, transform=transform)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size)

    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
    test(model, device, test_loader)


if __name__ == "__main__":
    main()

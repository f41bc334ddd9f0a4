# corpus: python=torch steps=36
"""Super-resolution, as the PyTorch super_resolution example trains it: a Dataset over a folder
that opens each image with PIL, converts it to YCbCr and keeps Y, then center-crops it for the
target and crops + resizes it down for the input (torchvision transforms on PIL images);
`--threads` DataLoader workers; an ESPCN-style net with PixelShuffle; a PSNR check per epoch.
The folder is generated (corpus/_data.py) unless --data names one.

    python super_resolution.py --upscale_factor 3 --threads 4 --nEpochs 6
"""

import argparse
import math
from os import listdir
from os.path import join

import _data
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import CenterCrop, Compose, Resize, ToTensor


def is_image_file(filename):
    return any(filename.endswith(ext) for ext in [".png", ".jpg", ".jpeg"])


def load_img(filepath):
    img = Image.open(filepath).convert("YCbCr")
    y, _, _ = img.split()
    return y


class DatasetFromFolder(Dataset):
    def __init__(self, image_dirs, input_transform=None, target_transform=None):
        super().__init__()
        self.image_filenames = sorted(join(d, x) for d in image_dirs for x in listdir(d) if is_image_file(x))
        self.input_transform = input_transform
        self.target_transform = target_transform

    def __getitem__(self, index):
        input = load_img(self.image_filenames[index])
        target = input.copy()
        if self.input_transform:
            input = self.input_transform(input)
        if self.target_transform:
            target = self.target_transform(target)
        return input, target

    def __len__(self):
        return len(self.image_filenames)


def calculate_valid_crop_size(crop_size, upscale_factor):
    return crop_size - (crop_size % upscale_factor)


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor**2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


def main():
    p = argparse.ArgumentParser(description="PyTorch Super Res Example")
    p.add_argument("--data", default=None, help="a folder of images, any sub-folders (default: generated)")
    p.add_argument("--upscale_factor", type=int, default=3)
    p.add_argument("--crop_size", type=int, default=48)
    p.add_argument("--batchSize", "--batch-size", dest="batchSize", type=int, default=16)
    p.add_argument("--testBatchSize", type=int, default=32)
    p.add_argument("--nEpochs", "--epochs", dest="nEpochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", "--num-workers", dest="threads", type=int, default=4)
    p.add_argument("--limit-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    p.add_argument("--seed", type=int, default=123)
    opt = p.parse_args()
    torch.manual_seed(opt.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    root = opt.data or str(_data.image_folder())
    dirs = sorted(join(root, d) for d in listdir(root))
    train_dirs, test_dirs = dirs[:-1], dirs[-1:]
    crop_size = calculate_valid_crop_size(opt.crop_size, opt.upscale_factor)
    input_tf = Compose([CenterCrop(crop_size), Resize(crop_size // opt.upscale_factor), ToTensor()])
    target_tf = Compose([CenterCrop(crop_size), ToTensor()])
    train_set = DatasetFromFolder(train_dirs, input_tf, target_tf)
    test_set = DatasetFromFolder(test_dirs, input_tf, target_tf)
    training_data_loader = DataLoader(dataset=train_set, num_workers=opt.threads, batch_size=opt.batchSize, shuffle=True)
    testing_data_loader = DataLoader(dataset=test_set, num_workers=opt.threads, batch_size=opt.testBatchSize)

    model = Net(upscale_factor=opt.upscale_factor).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.lr)

    for epoch in range(1, opt.nEpochs + 1):
        epoch_loss = 0
        for iteration, batch in enumerate(training_data_loader, 1):
            input, target = batch[0].to(device), batch[1].to(device)
            optimizer.zero_grad()
            loss = criterion(model(input), target)
            epoch_loss += loss.item()
            loss.backward()
            optimizer.step()
            print(f"===> Epoch[{epoch}]({iteration}/{len(training_data_loader)}): Loss: {loss.item():.4f}")
            if opt.limit_batches and iteration >= opt.limit_batches:
                break
        print(f"===> Epoch {epoch} Complete: Avg. Loss: {epoch_loss / iteration:.4f}")
        avg_psnr = 0
        with torch.no_grad():
            for batch in testing_data_loader:
                input, target = batch[0].to(device), batch[1].to(device)
                mse = criterion(model(input), target)
                avg_psnr += 10 * math.log10(1 / mse.item())
        print(f"===> Avg. PSNR: {avg_psnr / len(testing_data_loader):.4f} dB")


if __name__ == "__main__":
    main()

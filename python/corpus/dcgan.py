# corpus: python=torch steps=24
"""A DCGAN, as the PyTorch DCGAN example trains one: an ImageFolder resized and center-cropped,
`--workers` DataLoader workers, a generator and a discriminator with an Adam optimizer each;
every batch updates D (on real, then on fake images) and then G. Sized for a CPU (32×32, narrow
nets). The folder is generated (corpus/_data.py) unless --dataroot names one.

    python dcgan.py --workers 2 --niter 8
"""

import argparse

import _data
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def weights_init(m):
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif name.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, nz, ngf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),  # 4×4
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # 8×8
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),  # 16×16
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),  # 32×32
            nn.Tanh(),
        )

    def forward(self, x):
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self, ndf, nc):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # 16×16
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),  # 8×8
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),  # 4×4
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def main():
    p = argparse.ArgumentParser(description="DCGAN")
    p.add_argument("--dataroot", default=None, help="an ImageFolder (default: generated)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batchSize", "--batch-size", dest="batchSize", type=int, default=32)
    p.add_argument("--imageSize", type=int, default=32)
    p.add_argument("--nz", type=int, default=64)
    p.add_argument("--ngf", type=int, default=16)
    p.add_argument("--ndf", type=int, default=16)
    p.add_argument("--niter", "--epochs", dest="niter", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.0002)
    p.add_argument("--beta1", type=float, default=0.5)
    p.add_argument("--limit-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    p.add_argument("--manualSeed", type=int, default=999)
    opt = p.parse_args()
    torch.manual_seed(opt.manualSeed)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    dataset = datasets.ImageFolder(
        root=opt.dataroot or str(_data.image_folder()),
        transform=transforms.Compose(
            [
                transforms.Resize(opt.imageSize),
                transforms.CenterCrop(opt.imageSize),
                transforms.ToTensor(),
                transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
            ]
        ),
    )
    dataloader = DataLoader(dataset, batch_size=opt.batchSize, shuffle=True, num_workers=opt.workers)

    netG = Generator(opt.nz, opt.ngf, 3).to(device)
    netG.apply(weights_init)
    netD = Discriminator(opt.ndf, 3).to(device)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    real_label, fake_label = 1.0, 0.0
    optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    for epoch in range(opt.niter):
        for i, data in enumerate(dataloader, 0):
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            real = data[0].to(device)
            batch_size = real.size(0)
            label = torch.full((batch_size,), real_label, dtype=real.dtype, device=device)
            output = netD(real)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()
            noise = torch.randn(batch_size, opt.nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            errD = errD_real + errD_fake
            optimizerD.step()
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            optimizerG.step()
            if i % 5 == 0:
                print(
                    f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f} "
                    f"D(x): {D_x:.4f} D(G(z)): {D_G_z2:.4f}"
                )
            if opt.limit_batches and i + 1 >= opt.limit_batches:
                break
    print(f"final Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f} D(x): {D_x:.4f}")


if __name__ == "__main__":
    main()

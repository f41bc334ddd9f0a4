# corpus: python=torch steps=24
"""A Lightning training script as Lightning's docs write one: a LightningDataModule whose
train_dataloader is an ImageFolder DataLoader with workers, a LightningModule with
training_step / configure_optimizers, and `Trainer.fit` on the CPU. The folder is generated
(corpus/_data.py) unless --data names one.

    python lightning_module.py --num-workers 2 --epochs 8
"""

import argparse
import warnings

import _data
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


class ShapesDataModule(L.LightningDataModule):
    def __init__(self, data_dir, batch_size=32, num_workers=2, size=48):
        super().__init__()
        self.data_dir, self.batch_size, self.num_workers = data_dir, batch_size, num_workers
        self.transform = transforms.Compose(
            [
                transforms.Resize((size, size)),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
            ]
        )

    def setup(self, stage=None):
        self.train_set = datasets.ImageFolder(self.data_dir, transform=self.transform)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)


class LitClassifier(L.LightningModule):
    def __init__(self, num_classes=4, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 16, num_classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", acc, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    p = argparse.ArgumentParser(description="Lightning image classifier")
    p.add_argument("--data", default=None, help="an ImageFolder (default: generated)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--limit-batches", type=int, default=0, help="Trainer(limit_train_batches=N) (0: all)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(42, verbose=False)
    dm = ShapesDataModule(args.data or str(_data.image_folder()), args.batch_size, args.num_workers)
    model = LitClassifier(num_classes=len(_data.CLASSES))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        limit_train_batches=args.limit_batches or None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    print(f"train_loss={m['train_loss'].item():.4f} train_acc={m['train_acc'].item():.4f}")


if __name__ == "__main__":
    main()

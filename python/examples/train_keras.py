"""A plain Keras 3 training script, with nothing of pipeprof in it.

    KERAS_BACKEND=jax python train_keras.py --epochs 2
    pipeprof run -- python train_keras.py --epochs 2 --workers 2

Trains a small CNN on random images from a PyDataset (optionally in worker processes), with
a validation set.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402


class Images(keras.utils.PyDataset):
    def __init__(self, n, batch, size, seed, **kw):
        super().__init__(**kw)
        self.n, self.batch, self.size = n, batch, size
        rng = np.random.default_rng(seed)
        self.y = rng.integers(0, 4, n)

    def __len__(self):
        return (self.n + self.batch - 1) // self.batch

    def __getitem__(self, i):
        ys = self.y[i * self.batch : (i + 1) * self.batch]
        # Images whose mean says the class: learnable, and some work per batch.
        xs = np.random.default_rng(i).random((len(ys), self.size, self.size, 3), dtype=np.float32)
        xs += ys[:, None, None, None].astype(np.float32)
        return xs, ys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    kw = {"workers": args.workers, "use_multiprocessing": True} if args.workers else {}
    train = Images(args.images, args.batch_size, args.size, 1, **kw)
    val = Images(args.images // 4, args.batch_size, args.size, 2)
    model = keras.Sequential(
        [
            keras.Input((args.size, args.size, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2)


if __name__ == "__main__":
    main()

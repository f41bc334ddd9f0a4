"""Keras 3 training that needs no TensorFlow (JAX or torch backend), printing its own images/s.

Nothing of pipeprof in it; the backend is KERAS_BACKEND's. Two models, as users write them:

- `--model mlp`: the quick-start MLP (784-128-10) fitted on NumPy arrays in memory;
- `--model cnn --data DIR`: a small CNN on an image folder (one sub-folder per class) read by a
  `keras.utils.PyDataset` that decodes each file with PIL, resizes it and flips half of them
  (the folder loader Keras users write where `image_dataset_from_directory`'s tf.data is absent).

    pipeprof demo-data /tmp/shapes --per-class 24 --size 64x64
    KERAS_BACKEND=jax python keras_rate.py --model cnn --data /tmp/shapes --steps 40
    KERAS_BACKEND=torch pipeprof run --once -- python keras_rate.py --model mlp --steps 200

Prints "done: N steps, R images/s after the first batch": the rate from the end of the first
batch (compilation left out) to the end of the last, the device synchronised by reading the
weights back.
"""

import argparse
import time
from pathlib import Path

import keras
import numpy as np
from PIL import Image


class Folder(keras.utils.PyDataset):
    """An image folder, decoded and augmented per batch."""

    def __init__(self, root, batch, size, **kw):
        super().__init__(**kw)
        classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir())
        self.items = [
            (str(f), i)
            for i, c in enumerate(classes)
            for f in sorted((Path(root) / c).iterdir())
            if f.suffix.lower() in (".png", ".jpg", ".jpeg")
        ]
        if not self.items:
            raise SystemExit(f"keras_rate.py: no .png/.jpg images in the class folders of {root}")
        order = np.random.default_rng(1).permutation(len(self.items))
        self.items = [self.items[i] for i in order]
        self.classes, self.batch, self.size = len(classes), batch, size

    def __len__(self):
        return len(self.items) // self.batch

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        xs, ys = [], []
        for path, label in self.items[i * self.batch : (i + 1) * self.batch]:
            with Image.open(path) as img:
                x = np.asarray(img.convert("RGB").resize((self.size, self.size)), dtype="float32") / 255.0
            xs.append(x[:, ::-1] if rng.random() < 0.5 else x)
            ys.append(label)
        return np.stack(xs), np.asarray(ys)


class Rate(keras.callbacks.Callback):
    """Times the batches after the first; stops training after --steps."""

    def __init__(self, steps, batch):
        super().__init__()
        self.steps, self.batch, self.done, self.t0 = steps, batch, 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.t0 is None:
            self.t0 = time.perf_counter()
        if self.done >= self.steps:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        keras.ops.convert_to_numpy(self.model.trainable_weights[0])
        took = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        images = (self.done - 1) * self.batch
        rate = images / took if took > 0 else 0.0
        print(f"done: {self.done} steps, {rate:.1f} images/s after the first batch", flush=True)


def mlp(args):
    rng = np.random.default_rng(0)
    ys = rng.integers(0, 10, args.images)
    xs = (rng.random((args.images, 784)) * 0.5 + ys[:, None] / 20.0).astype("float32")
    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, activation="softmax")]
    )
    return model, dict(x=xs, y=ys, batch_size=args.batch_size)


def cnn(args):
    if not args.data:
        raise SystemExit("keras_rate.py: --model cnn needs --data DIR (an image folder)")
    data = Folder(args.data, args.batch_size, args.size, workers=max(args.workers, 1), use_multiprocessing=False)
    model = keras.Sequential(
        [
            keras.Input((args.size, args.size, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(data.classes, activation="softmax"),
        ]
    )
    return model, dict(x=data)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--data", help="--model cnn: an image folder, one sub-folder per class")
    p.add_argument("--steps", type=int, default=200, help="stop after this many batches")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--images", type=int, default=8192, help="--model mlp: samples in memory")
    p.add_argument("--size", type=int, default=64, help="--model cnn: images resized to SIZE×SIZE")
    p.add_argument("--workers", type=int, default=0, help="--model cnn: the PyDataset's worker threads")
    args = p.parse_args()
    model, fit = (cnn if args.model == "cnn" else mlp)(args)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    batches = len(fit["x"]) if args.model == "cnn" else args.images // args.batch_size
    epochs = max(1, -(-args.steps // max(batches, 1)))
    model.fit(**fit, epochs=epochs, verbose=0, callbacks=[Rate(args.steps, args.batch_size)])


if __name__ == "__main__":
    main()

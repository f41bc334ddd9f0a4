# corpus: python=tf steps=14
"""Image + mask pairs in a `keras.utils.Sequence` whose `__init__` does not call
`super().__init__()`, as the older Oxford pets segmentation example writes it (`class
OxfordPets(keras.utils.Sequence)`): sorted image and mask paths, `load_img(..., target_size)`
per file in `__getitem__`, a small U-Net-like model, Keras 3 on TensorFlow, no workers (Keras
then reads the batches in tf.data's threads). The pairs are generated (corpus/_data.py) unless
--data names a folder with images/ and masks/.

    python keras_sequence_no_super.py --epochs 2
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _clock  # noqa: E402
import _data  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from keras.utils import load_img  # noqa: E402


class OxfordPets(keras.utils.Sequence):
    """Helper to iterate over the data (as Numpy arrays)."""

    def __init__(self, batch_size, img_size, input_img_paths, target_img_paths):
        self.batch_size = batch_size
        self.img_size = img_size
        self.input_img_paths = input_img_paths
        self.target_img_paths = target_img_paths

    def __len__(self):
        return len(self.target_img_paths) // self.batch_size

    def __getitem__(self, idx):
        """Returns tuple (input, target) correspond to batch #idx."""
        i = idx * self.batch_size
        batch_input_img_paths = self.input_img_paths[i : i + self.batch_size]
        batch_target_img_paths = self.target_img_paths[i : i + self.batch_size]
        x = np.zeros((self.batch_size,) + self.img_size + (3,), dtype="float32")
        for j, path in enumerate(batch_input_img_paths):
            x[j] = np.asarray(load_img(path, target_size=self.img_size), dtype="float32") / 255.0
        y = np.zeros((self.batch_size,) + self.img_size + (1,), dtype="uint8")
        for j, path in enumerate(batch_target_img_paths):
            img = load_img(path, target_size=self.img_size, color_mode="grayscale")
            y[j] = np.expand_dims(img, 2)
        return x, y


def get_model(img_size, num_classes):
    inputs = keras.Input(shape=img_size + (3,))
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inputs)
    previous = x
    for filters in (16, 32):
        x = layers.SeparableConv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(filters, 1, strides=2, padding="same")(previous)
        x = layers.add([x, residual])
        previous = x
    for filters in (32, 16, 16):
        x = layers.Conv2DTranspose(filters, 3, padding="same", activation="relu")(x)
        x = layers.UpSampling2D(2)(x)
        residual = layers.UpSampling2D(2)(previous)
        residual = layers.Conv2D(filters, 1, padding="same")(residual)
        x = layers.add([x, residual])
        previous = x
    outputs = layers.Conv2D(num_classes, 3, activation="softmax", padding="same")(x)
    return keras.Model(inputs, outputs)


def main():
    p = argparse.ArgumentParser(description="U-Net-like segmentation on a Sequence without super().__init__")
    p.add_argument("--data", default=None, help="a folder with images/ and masks/ (default: generated)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="fit(steps_per_epoch=N) (default: all)")
    p.add_argument("--clock", default=None, help="write the script's own epoch and step times here (JSON)")
    args = p.parse_args()
    root = args.data or str(_data.segmentation_folder())
    input_img_paths = sorted(os.path.join(root, "images", f) for f in os.listdir(os.path.join(root, "images")))
    target_img_paths = sorted(os.path.join(root, "masks", f) for f in os.listdir(os.path.join(root, "masks")))
    img_size = (args.size, args.size)
    num_classes = len(_data.CLASSES) + 1  # the shapes and the background

    val_samples = 16
    train_gen = OxfordPets(args.batch_size, img_size, input_img_paths[:-val_samples], target_img_paths[:-val_samples])
    val_gen = OxfordPets(args.batch_size, img_size, input_img_paths[-val_samples:], target_img_paths[-val_samples:])
    model = get_model(img_size, num_classes)
    # No accuracy metric: the loss is all this script reports.
    model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy")
    steps = args.steps_per_epoch or len(train_gen)
    clock = _clock.time_history(keras, args.clock, steps * args.batch_size)
    history = model.fit(
        train_gen,
        epochs=args.epochs,
        validation_data=val_gen,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[clock],
        verbose=2,
    )
    h = history.history
    print(f"loss: {h['loss'][-1]:.4f} - val_loss: {h['val_loss'][-1]:.4f}")


if __name__ == "__main__":
    main()

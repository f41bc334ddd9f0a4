# corpus: python=tf steps=60
"""Keras 3 on TensorFlow fitting NumPy arrays in memory, as Keras's "Simple MNIST convnet"
example does: scale to [0, 1], one-hot labels, a small convnet, `model.fit(x, y, batch_size,
epochs, validation_split)`, then `evaluate`. The digits are generated (corpus/_data.py), not
downloaded.

    python keras_numpy_fit.py --epochs 4
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _data  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402


def main():
    p = argparse.ArgumentParser(description="Simple MNIST-like convnet")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="fit(steps_per_epoch=N) (default: all)")
    args = p.parse_args()
    num_classes, input_shape = 10, (28, 28, 1)

    x_train, y_train = _data.mnist_like(6000, seed=0)
    x_test, y_test = _data.mnist_like(1000, seed=1)
    x_train = np.expand_dims(x_train.astype("float32") / 255, -1)
    x_test = np.expand_dims(x_test.astype("float32") / 255, -1)
    print("x_train shape:", x_train.shape)
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        validation_split=0.1,
        verbose=2,
    )
    score = model.evaluate(x_test, y_test, verbose=0)
    print("Test loss:", score[0], "Test accuracy:", score[1])


if __name__ == "__main__":
    main()

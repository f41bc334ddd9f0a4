# corpus: python=tf steps=18
"""A tf.keras ImageDataGenerator, as TensorFlow's classic image classification tutorial trains
with it: `ImageDataGenerator(rescale, rotation, shifts, flip, zoom)`, `flow_from_directory` for
training and validation, a three-block convnet, `model.fit(generator, steps_per_epoch, epochs,
validation_data, validation_steps)`. `tf.keras` is whatever TensorFlow gives (Keras 3 on
TensorFlow 2.16 and later). The folder is generated (corpus/_data.py) unless --data names one.

As in the tutorial, steps_per_epoch is samples // batch_size, one short of the generator's
length (it keeps the last, partial batch): under Keras 3 the iterator then runs on across
epochs, so every second epoch trains the one batch left (9, 1, 9, 1, … steps). Kept: it is
what the copied script does.

    python tf_image_data_generator.py --epochs 6
"""

import argparse

import _data
import tensorflow as tf


def main():
    p = argparse.ArgumentParser(description="ImageDataGenerator.flow_from_directory")
    p.add_argument("--data", default=None, help="a folder with one sub-folder per class (default: generated)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps-per-epoch", type=int, default=0, help="0: the whole training set per epoch")
    args = p.parse_args()
    IMG_HEIGHT = IMG_WIDTH = args.size
    train_dir = args.data or str(_data.image_folder())

    image_generator = tf.keras.preprocessing.image.ImageDataGenerator(
        rescale=1.0 / 255,
        rotation_range=45,
        width_shift_range=0.15,
        height_shift_range=0.15,
        horizontal_flip=True,
        zoom_range=0.5,
        validation_split=0.2,
    )
    train_data_gen = image_generator.flow_from_directory(
        batch_size=args.batch_size,
        directory=train_dir,
        shuffle=True,
        target_size=(IMG_HEIGHT, IMG_WIDTH),
        class_mode="categorical",
        subset="training",
    )
    val_data_gen = image_generator.flow_from_directory(
        batch_size=args.batch_size,
        directory=train_dir,
        target_size=(IMG_HEIGHT, IMG_WIDTH),
        class_mode="categorical",
        subset="validation",
    )
    num_classes = train_data_gen.num_classes
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(IMG_HEIGHT, IMG_WIDTH, 3)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(num_classes),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    steps = args.steps_per_epoch or train_data_gen.samples // args.batch_size
    history = model.fit(
        train_data_gen,
        steps_per_epoch=steps,
        epochs=args.epochs,
        validation_data=val_data_gen,
        validation_steps=max(1, val_data_gen.samples // args.batch_size),
        verbose=2,
    )
    acc, val_acc = history.history["accuracy"][-1], history.history["val_accuracy"][-1]
    print(f"Training accuracy: {acc:.4f}, validation accuracy: {val_acc:.4f}")


if __name__ == "__main__":
    main()

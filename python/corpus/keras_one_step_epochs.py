# corpus: python=tf steps=6
"""Keras's image classification from scratch on a small folder, one batch an epoch: the
folder read by `image_dataset_from_directory` (batch_size larger than the training set, as a
first try on a few images does), data augmentation layers applied in a `map`, `.prefetch`,
a small residual convnet, Keras 3 on TensorFlow. Every epoch is one training step and a
validation pass. The folder is generated (corpus/_data.py) unless --data names one.

    python keras_one_step_epochs.py --epochs 6
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _clock  # noqa: E402
import _data  # noqa: E402


def make_model(keras, layers, input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(32, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for size in (32, 64):
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
        x = layers.add([x, residual])
        previous_block_activation = x
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    outputs = layers.Dense(num_classes, activation=None)(x)
    return keras.Model(inputs, outputs)


def main():
    p = argparse.ArgumentParser(description="image classification from scratch, one batch an epoch")
    p.add_argument("--data", default=None, help="a folder with one sub-folder per class (default: generated)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--clock", default=None, help="write the script's own epoch and step times here (JSON)")
    args = p.parse_args()
    import keras
    import tensorflow as tf
    from keras import layers

    image_size = (args.size, args.size)
    train_ds, val_ds = keras.utils.image_dataset_from_directory(
        args.data or str(_data.image_folder()),
        validation_split=0.2,
        subset="both",
        seed=1337,
        image_size=image_size,
        batch_size=args.batch_size,
    )
    num_classes = len(train_ds.class_names)
    train_images = sum(int(y.shape[0]) for y in train_ds.map(lambda x, y: y))
    data_augmentation_layers = [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)]

    def data_augmentation(images):
        for layer in data_augmentation_layers:
            images = layer(images)
        return images

    train_ds = train_ds.map(lambda img, label: (data_augmentation(img), label), num_parallel_calls=tf.data.AUTOTUNE)
    train_ds = train_ds.prefetch(tf.data.AUTOTUNE)
    val_ds = val_ds.prefetch(tf.data.AUTOTUNE)

    model = make_model(keras, layers, image_size + (3,), num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    clock = _clock.time_history(keras, args.clock, train_images)
    history = model.fit(train_ds, epochs=args.epochs, callbacks=[clock], validation_data=val_ds, verbose=2)
    h = history.history
    print(f"loss: {h['loss'][-1]:.4f} - acc: {h['acc'][-1]:.4f} - val_acc: {h['val_acc'][-1]:.4f}")


if __name__ == "__main__":
    main()

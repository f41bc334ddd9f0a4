# corpus: python=tf steps=20
"""Keras 3 on TensorFlow reading an image folder with tf.data, as Keras's image classification
example does (`image_dataset_from_directory`, `.map(..., num_parallel_calls=AUTOTUNE)`,
`.prefetch(AUTOTUNE)`), with a heavy augmentation in the map: a random flip, brightness, and
repeated Gaussian blurs, as a denoising or blur-robustness script adds. The map is the work.
The folder is generated (corpus/_data.py) unless --data names one.

    python keras_tfdata_map.py --epochs 8
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _data  # noqa: E402


def gaussian_kernel(size, sigma):
    import tensorflow as tf

    x = tf.range(-(size // 2), size // 2 + 1, dtype=tf.float32)
    g = tf.exp(-(x**2) / (2.0 * sigma**2))
    g = g / tf.reduce_sum(g)
    k = tf.tensordot(g, g, axes=0)[:, :, None, None]
    return tf.tile(k, [1, 1, 3, 1])  # one kernel per channel (depthwise)


def main():
    p = argparse.ArgumentParser(description="image_dataset_from_directory + a heavy map")
    p.add_argument("--data", default=None, help="a folder with one sub-folder per class (default: generated)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--blurs", type=int, default=24, help="Gaussian blurs per batch in the map")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="fit(steps_per_epoch=N) (default: all)")
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
    kernel = gaussian_kernel(7, 1.5)

    def augment(images, labels):
        images = tf.image.random_flip_left_right(images)
        images = tf.image.random_brightness(images, 20.0)
        for _ in range(args.blurs):
            images = tf.nn.depthwise_conv2d(images, kernel, strides=[1, 1, 1, 1], padding="SAME")
        return images / 255.0, labels

    train_ds = train_ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val_ds = val_ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential(
        [
            keras.Input(shape=image_size + (3,)),
            layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.25),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(
        train_ds, epochs=args.epochs, validation_data=val_ds, steps_per_epoch=args.steps_per_epoch, verbose=2
    )
    h = history.history
    print(f"loss: {h['loss'][-1]:.4f} - accuracy: {h['accuracy'][-1]:.4f} - val_accuracy: {h['val_accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()

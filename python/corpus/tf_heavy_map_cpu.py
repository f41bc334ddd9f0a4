# corpus: python=tf steps=36
"""A `tf.data` map heavy enough to limit a model that trains on the CPU: an image folder read
with `tf.keras.utils.image_dataset_from_directory`, then `.map(augment,
num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)` where `augment` is a flip, a
brightness jitter and repeated Gaussian blurs (depthwise convolutions), as a blur-robustness or
denoising script adds; a small convnet trained with `model.fit` on the same cores.

`--augment none` replaces the map's function by the identity and changes nothing else, so the
same script measures what the map costs: the ground truth a profiler's verdict is checked
against. The script counts its own steps and images and times its steady training (every step
after the first, which traces the graph) with `time.perf_counter`, and prints them as

    counted: batch_size=32 train_steps=36 train_images=1152 images_per_s=348.1 step_p50_ms=91.9

The folder is generated (corpus/_data.py) unless --data names one.

    python tf_heavy_map_cpu.py --augment heavy
    python tf_heavy_map_cpu.py --augment none
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _data  # noqa: E402


def gaussian_kernel(tf, size, sigma):
    """A size×size Gaussian, one copy per RGB channel (a depthwise kernel)."""
    x = tf.range(-(size // 2), size // 2 + 1, dtype=tf.float32)
    g = tf.exp(-(x**2) / (2.0 * sigma**2))
    g = g / tf.reduce_sum(g)
    k = tf.tensordot(g, g, axes=0)[:, :, None, None]
    return tf.tile(k, [1, 1, 3, 1])


def counter(keras, batch_size):
    """A callback counting the training steps and images, and timing the steps after the first."""

    class Counter(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.steps, self.starts, self.ends = 0, [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())
            self.steps += 1

        def steady(self):
            """(images per second, median step ms) of every step after the first."""
            if self.steps < 2:
                return 0.0, 0.0
            span = self.ends[-1] - self.ends[0]
            per_step = [e - s for s, e in zip(self.starts[1:], self.ends[1:])]
            return (self.steps - 1) * batch_size / span, 1000.0 * statistics.median(per_step)

    return Counter()


def main():
    p = argparse.ArgumentParser(description="image_dataset_from_directory + a heavy tf.data map, CPU training")
    p.add_argument("--data", default=None, help="a folder with one sub-folder per class (default: generated)")
    p.add_argument("--augment", choices=("none", "heavy"), default="heavy", help="the map's work (none: identity)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--blurs", type=int, default=12, help="Gaussian blurs per batch in the heavy map")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="fit(steps_per_epoch=N) (default: all)")
    args = p.parse_args()
    import tensorflow as tf

    keras = tf.keras
    image_size = (args.size, args.size)
    train_ds = keras.utils.image_dataset_from_directory(
        args.data or str(_data.image_folder()), seed=1337, image_size=image_size, batch_size=args.batch_size
    )
    num_classes, files = len(train_ds.class_names), len(train_ds.file_paths)
    kernel = gaussian_kernel(tf, 7, 1.5)

    def augment(images, labels):
        images = tf.image.random_flip_left_right(images)
        images = tf.image.random_brightness(images, 20.0)
        for _ in range(args.blurs):
            images = tf.nn.depthwise_conv2d(images, kernel, strides=[1, 1, 1, 1], padding="SAME")
        return images, labels

    def identity(images, labels):
        return images, labels

    fn = augment if args.augment == "heavy" else identity
    train_ds = train_ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential(
        [
            keras.Input(shape=image_size + (3,)),
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    count = counter(keras, args.batch_size)
    history = model.fit(
        train_ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[count], verbose=2
    )
    rate, step_ms = count.steady()
    # A whole epoch is every file (its last batch may be short); steps_per_epoch draws full batches.
    train_images = args.epochs * files if args.steps_per_epoch is None else count.steps * args.batch_size
    print(
        f"counted: batch_size={args.batch_size} train_steps={count.steps} train_images={train_images} "
        f"images_per_s={rate:.1f} step_p50_ms={step_ms:.1f}"
    )
    h = history.history
    print(f"loss: {h['loss'][-1]:.4f} - accuracy: {h['accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()

"""Keras 3 on TensorFlow reading an image folder with tf.data, as Keras's own image
classification example does: `image_dataset_from_directory`, an augmenting `map` and
`prefetch`; nothing of pipeprof in it. `--blur N` makes the map heavy: N 5×5 box blurs of
each batch (a depthwise convolution each), work the map's function does itself.

    pipeprof demo-data /tmp/shapes --per-class 24 --size 64
    pipeprof run --once -- python keras_image_dataset.py --data /tmp/shapes
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a folder with one sub-folder of images per class")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--blur", type=int, default=0, help="5x5 box blurs the map does to each batch")
    args = p.parse_args()
    import keras
    import tensorflow as tf

    size = (args.size, args.size)
    train, val = keras.utils.image_dataset_from_directory(
        args.data, image_size=size, batch_size=args.batch_size, validation_split=0.25, subset="both", seed=1
    )
    classes = len(train.class_names)
    flip = keras.layers.RandomFlip("horizontal")
    box = tf.ones((5, 5, 3, 1)) / 25.0

    def augment(xs, ys):
        xs = flip(xs / 255.0, training=True)
        for _ in range(args.blur):
            xs = tf.nn.depthwise_conv2d(xs, box, [1, 1, 1, 1], "SAME")
        return xs, ys

    train = train.map(augment, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    val = val.map(lambda xs, ys: (xs / 255.0, ys)).prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential(
        [
            keras.Input((args.size, args.size, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2)
    print("done", flush=True)


if __name__ == "__main__":
    main()

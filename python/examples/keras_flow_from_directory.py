"""An image folder fed through `ImageDataGenerator.flow_from_directory` with augmentation,
and a validation generator, as the Colab CNN tutorials do; nothing of pipeprof in it.

    pipeprof demo-data /tmp/shapes --per-class 24 --size 64
    pipeprof run --once -- python keras_flow_from_directory.py --data /tmp/shapes
    pipeprof run --once -- python keras_flow_from_directory.py --data /tmp/shapes --tf-keras

`tf.keras` is Keras 3 on TensorFlow by default; --tf-keras makes it tf.keras 2 (the tf_keras
package, TF_USE_LEGACY_KERAS=1). --workers N loads batches in N processes (a PyDataset's
workers in Keras 3, fit's workers in tf.keras 2).
"""

import argparse
import os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a folder with one sub-folder of images per class")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--tf-keras", action="store_true", help="tf.keras 2 (tf_keras) instead of Keras 3")
    args = p.parse_args()
    if args.tf_keras:
        # tf.keras is tf_keras, Keras 2, when asked for before TensorFlow is imported.
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    keras = tf.keras
    ImageDataGenerator = keras.preprocessing.image.ImageDataGenerator

    gen = ImageDataGenerator(rescale=1 / 255, rotation_range=15, horizontal_flip=True, validation_split=0.25)
    flow = dict(target_size=(args.size, args.size), batch_size=args.batch_size, class_mode="sparse", seed=1)
    train = gen.flow_from_directory(args.data, subset="training", **flow)
    val = gen.flow_from_directory(args.data, subset="validation", shuffle=False, **flow)
    fit_kw = {}
    if args.workers:
        if args.tf_keras:
            fit_kw = dict(workers=args.workers, use_multiprocessing=True)
        else:
            train.workers, train.use_multiprocessing = args.workers, True
    model = keras.Sequential(
        [
            keras.Input((args.size, args.size, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(train.num_classes, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2, **fit_kw)
    print("done", flush=True)


if __name__ == "__main__":
    main()

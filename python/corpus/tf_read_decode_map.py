# corpus: python=tf steps=24
"""TensorFlow's "load images with tf.data" tutorial: the file paths listed, a
`tf.data.Dataset.from_tensor_slices` over them, `.map(process_path,
num_parallel_calls=AUTOTUNE)` that reads (`tf.io.read_file`), decodes (`tf.io.decode_png`)
and resizes (`tf.image.resize`) each image, `.batch`, `.prefetch(AUTOTUNE)`, a small convnet
trained with `model.fit`. The PNG files of a generated folder (corpus/_data.py) unless --data
names one.

    python tf_read_decode_map.py --epochs 3
"""

import argparse
import glob
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _clock  # noqa: E402
import _data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description="tf.data: read_file, decode_png, resize in a map")
    p.add_argument("--data", default=None, help="a folder with one sub-folder per class (default: generated)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--clock", default=None, help="write the script's own epoch and step times here (JSON)")
    args = p.parse_args()
    import tensorflow as tf

    keras = tf.keras
    root = args.data or str(_data.image_folder())
    class_names = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    paths = sorted(glob.glob(os.path.join(root, "*", "*.png")))
    labels = [class_names.index(os.path.basename(os.path.dirname(f))) for f in paths]

    def process_path(file_path, label):
        img = tf.io.read_file(file_path)
        img = tf.io.decode_png(img, channels=3)
        img = tf.image.resize(img, [args.size, args.size])
        return img / 255.0, label

    ds = tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), seed=42)
    ds = ds.map(process_path, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(args.batch_size).prefetch(buffer_size=tf.data.AUTOTUNE)

    model = keras.Sequential(
        [
            keras.Input(shape=(args.size, args.size, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(len(class_names)),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    clock = _clock.time_history(keras, args.clock, len(paths))
    t0 = time.perf_counter()
    history = model.fit(ds, epochs=args.epochs, callbacks=[clock], verbose=2)
    print(f"fit took {time.perf_counter() - t0:.2f}s")
    h = history.history
    print(f"loss: {h['loss'][-1]:.4f} - accuracy: {h['accuracy'][-1]:.4f}")


if __name__ == "__main__":
    main()

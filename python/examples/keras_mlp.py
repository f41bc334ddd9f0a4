"""The TensorFlow quick-start MLP (784-128-10) trained with `fit` on NumPy arrays in memory,
with nothing of pipeprof in it. Random "digits" stand in for MNIST (nothing is downloaded).

    KERAS_BACKEND=tensorflow python keras_mlp.py --epochs 2
    pipeprof run -- python keras_mlp.py --tf-keras         # tf.keras 2 (the tf_keras package)

The backend is Keras's own choice (KERAS_BACKEND: tensorflow, jax or torch).
"""

import argparse
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--validation-split", type=float, default=0.0)
    p.add_argument("--steps-per-epoch", type=int, default=None)
    p.add_argument("--tf-keras", action="store_true", help="tf.keras 2 (tf_keras) instead of Keras 3")
    args = p.parse_args()
    if args.tf_keras:
        import tf_keras as keras
    else:
        import keras
    import numpy as np

    rng = np.random.default_rng(0)
    ys = rng.integers(0, 10, args.images)
    # Pixels whose mean says the digit: learnable in a few epochs.
    xs = (rng.random((args.images, 784)) * 0.5 + ys[:, None] / 20.0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=args.steps_per_execution,
    )
    t0 = time.perf_counter()
    model.fit(
        xs,
        ys,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=args.validation_split,
        steps_per_epoch=args.steps_per_epoch,
        verbose=2,
    )
    print(f"done: fit took {time.perf_counter() - t0:.3f} s", flush=True)


if __name__ == "__main__":
    main()

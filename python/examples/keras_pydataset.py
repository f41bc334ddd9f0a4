"""Image + mask pairs read with PIL in a `keras.utils.PyDataset` (a `Sequence` in tf.keras 2),
optionally in worker threads or processes, as segmentation scripts do; nothing of pipeprof
in it. The mask is the image's own brightness (a stand-in for a mask file beside it).

    pipeprof demo-data /tmp/shapes --per-class 24 --size 128x128
    pipeprof run --once -- python keras_pydataset.py --data /tmp/shapes --workers 2 --multiprocessing

Keras's backend is KERAS_BACKEND's (tensorflow, jax or torch); --tf-keras uses tf.keras 2.
--start spawn starts worker processes by spawning (the default here is fork); tf.keras 2 with
spawn is not supported by this script (its module picks Keras from the command line).
"""

import argparse
import multiprocessing
import sys
from pathlib import Path

# Module level, so that spawned worker processes can unpickle the data set.
if "--tf-keras" in sys.argv:
    import tf_keras as keras

    Base = keras.utils.Sequence
else:
    import keras

    Base = keras.utils.PyDataset
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402


class Pairs(Base):
    def __init__(self, files, batch, size, **kw):
        super().__init__(**kw)
        self.files, self.batch, self.size = files, batch, size

    def __len__(self):
        return (len(self.files) + self.batch - 1) // self.batch

    def __getitem__(self, i):
        xs, ms = [], []
        for f in self.files[i * self.batch : (i + 1) * self.batch]:
            img = Image.open(f).convert("RGB").resize((self.size, self.size))
            x = np.asarray(img, dtype="float32") / 255.0
            xs.append(x)
            ms.append((x.mean(axis=2, keepdims=True) > 0.5).astype("float32"))
        return np.stack(xs), np.stack(ms)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a folder of images (any depth)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--multiprocessing", action="store_true")
    p.add_argument("--start", choices=["fork", "spawn"], default=None)
    p.add_argument("--tf-keras", action="store_true", help="tf.keras 2 (tf_keras) instead of Keras 3")
    args = p.parse_args()
    if args.start:
        multiprocessing.set_start_method(args.start)
    files = sorted(str(f) for f in Path(args.data).rglob("*") if f.suffix.lower() in (".png", ".jpg", ".jpeg"))
    kw = {} if args.tf_keras else {"workers": args.workers, "use_multiprocessing": args.multiprocessing}
    fit_kw = {"workers": args.workers, "use_multiprocessing": args.multiprocessing} if args.tf_keras else {}
    data = Pairs(files, args.batch_size, args.size, **kw)
    model = keras.Sequential(
        [
            keras.Input((args.size, args.size, 3)),
            keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(1, 1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(data, epochs=args.epochs, verbose=2, **fit_kw)
    print("done", flush=True)


if __name__ == "__main__":
    main()

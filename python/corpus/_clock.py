"""The corpus scripts' own clock: a Keras callback timing each epoch and training step with
``time.perf_counter``, as TensorFlow's official models log them (their ``TimeHistory``). What
a script measures itself is the ground truth pipeprof's numbers are checked against: written
as JSON to ``--clock FILE`` when given, and a line at the end of training.
"""

import json
import time


def time_history(keras, path=None, images_per_epoch=None):
    """A ``keras.callbacks.Callback``: epoch times (``on_epoch_begin`` to ``on_epoch_end``,
    validation included), training step times (batch begin to batch end) and the steps run."""

    class TimeHistory(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epoch_s, self.step_s, self.steps = [], [], 0

        def on_epoch_begin(self, epoch, logs=None):
            self.t_epoch = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            self.t_step = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.step_s.append(time.perf_counter() - self.t_step)
            self.steps += 1

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_s.append(time.perf_counter() - self.t_epoch)

        def on_train_end(self, logs=None):
            print("epoch times: " + " ".join(f"{t:.2f}s" for t in self.epoch_s))
            if path:
                with open(path, "w") as f:
                    json.dump({"epoch_s": self.epoch_s, "step_s": self.step_s, "steps": self.steps, "images_per_epoch": images_per_epoch}, f)

    return TimeHistory()

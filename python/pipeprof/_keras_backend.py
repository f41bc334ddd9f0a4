"""Which Keras the program uses (Keras 3, or TensorFlow's), on which backend and device, and
the run's settings read from what ``fit`` was given (:func:`fit_settings`): for the Keras hooks
(:mod:`pipeprof.keras`) and the reader of a packed file (:func:`pipeprof.data.packed_dataset`).
Imports nothing of pipeprof's."""

import importlib


def keras_module():
    """``keras``, else ``tensorflow.keras``; ImportError naming both when neither imports."""
    for name in ("keras", "tensorflow.keras"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("pipeprof.keras needs keras (pip install keras) or tensorflow")


def backend_of(keras):
    """The backend ``keras`` runs on ("tensorflow", "jax", "torch"), or None when it cannot say."""
    if keras.__name__.split(".")[0] == "tf_keras":
        return "tensorflow"
    try:
        return keras.backend.backend()
    except Exception:
        return None


def fit_settings(hooks, data, batch_size, fit_kwargs):
    """The run's settings from what ``fit`` was given: framework, device, batch size, the data
    set's size, how many workers load it (0 for arrays in memory), the model's input."""
    settings = {"framework": "keras", "device": _device(hooks), "no_accuracy": False}
    if batch_size:
        settings["batch_size"] = int(batch_size)
    else:
        b = getattr(data, "batch_size", None)
        if isinstance(b, int) and b > 0:
            settings["batch_size"] = b
    workers = _workers(data, fit_kwargs)
    if workers is not None:
        settings["workers"] = workers
    elif _is_tf_dataset(data):
        # Its parallelism is num_parallel_calls, not workers: advice says so.
        settings["tf_data"] = True
    n = rows(data) or _int(getattr(data, "samples", None)) or _int(getattr(data, "n", None))
    if n:
        settings["images"] = n
    root = getattr(data, "directory", None)
    if isinstance(root, str):
        settings["data"] = root
    classes = getattr(data, "class_indices", None)
    if isinstance(classes, dict) and len(classes) <= 10000:
        settings["classes"] = [str(c) for c in sorted(classes, key=classes.get)]
    shape = _model_input(getattr(hooks, "model", None))
    if shape is not None and len(shape) == 4 and all(isinstance(d, int) for d in shape[1:]):
        # Keras images are (N, H, W, C).
        settings["input"] = [shape[3], shape[1], shape[2]]
    return settings


def _is_tf_dataset(data):
    """``data`` is a ``tf.data.Dataset`` (by its type's module: TensorFlow is never imported
    here for a program that does not use it)."""
    return any(
        c.__module__.startswith("tensorflow") and "Dataset" in c.__name__ for c in type(data).__mro__
    )


def _workers(data, fit_kwargs):
    """Processes or threads that load ``data`` besides the training thread: 0 for arrays in
    memory and a PyDataset Keras reads in-process; a PyDataset's (or tf_keras ``fit``'s)
    ``workers`` when Keras starts a pool for them; None when unknown (tf.data's own threads)."""
    if data is None or rows(data):
        return 0
    if isinstance(data, (list, tuple, dict)):
        return 0
    w = getattr(data, "workers", None)
    mp = getattr(data, "use_multiprocessing", None)
    if not isinstance(w, int):
        # tf_keras: a Sequence's workers are fit's arguments.
        w = fit_kwargs.get("workers", 1 if hasattr(data, "__getitem__") and hasattr(data, "__len__") else None)
        mp = fit_kwargs.get("use_multiprocessing", False)
    if not isinstance(w, int):
        return None
    # Keras starts a pool only for workers > 1, or 1 worker in its own process.
    return w if (w > 1 or (w > 0 and mp)) else 0


def _model_input(model):
    try:
        inputs = getattr(model, "inputs", None)
        if inputs:
            return tuple(None if d is None else int(d) for d in inputs[0].shape)
    except Exception:
        pass
    return None


def _device(hooks=None):
    """Where Keras computes: "cpu", or the accelerator its backend found."""
    try:
        name = getattr(hooks, "_pp_backend", None)
        if name is None:
            from keras import backend

            name = backend.backend()
        if name == "jax":
            import jax

            return jax.default_backend()
        if name == "torch":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        if name == "tensorflow":
            import tensorflow as tf

            return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
        return name
    except Exception:
        return ""


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def rows(data):
    """Rows of an array (a fit() input, a batch's first array), when it says; else 0."""
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return 0
    return 0

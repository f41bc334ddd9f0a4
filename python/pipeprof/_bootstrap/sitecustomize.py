"""pipeprof run's start-up hook: profiles this Python program with no edit to it.

`pipeprof run -- python train.py` puts this file's folder first on PYTHONPATH, so Python
imports it at start-up (the `site` module imports `sitecustomize`). It imports
`pipeprof._auto`, which connects to the run and hooks PyTorch's DataLoader and Keras's
`fit`, then hands over to the `sitecustomize` it shadows, if there is one.
"""

import os
import sys


def _pipeprof_start():
    if not os.environ.get("PIPEPROF_PARENT"):
        return
    try:
        from pipeprof import _auto
    except ImportError as e:
        # Said once per run, by its first Python process; workers stay quiet.
        if not os.environ.get("PIPEPROF_MAIN_PID"):
            print(
                f"pipeprof: this Python ({sys.executable}) cannot import pipeprof ({e}): "
                "install it there (pip install pipeprof) to see its stages; "
                "pipeprof run samples the machine only",
                file=sys.stderr,
            )
            os.environ["PIPEPROF_MAIN_PID"] = str(os.getpid())
        return
    try:
        _auto.start()
    except Exception as e:  # never break the user's program
        print(f"pipeprof: profiling is off in this process: {e!r}", file=sys.stderr)


def _chain():
    # The sitecustomize this one shadows (a distribution's, a virtualenv's) still runs.
    here = os.path.dirname(os.path.abspath(__file__))
    this = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        del sys.modules["sitecustomize"]
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and this is not None:
            sys.modules["sitecustomize"] = this


_pipeprof_start()
_chain()

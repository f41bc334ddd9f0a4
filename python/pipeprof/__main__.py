"""``python -m pipeprof ARGS``: the ``pipeprof`` command the wheel installed beside Python.

Useful where the environment's scripts folder is not on PATH (``python -m pipeprof run --
python train.py``). The command is the native binary; this only finds it and hands over.
"""

import os
import shutil
import sys
import sysconfig


def _command():
    here = os.path.join(sysconfig.get_path("scripts"), "pipeprof")
    if os.access(here, os.X_OK):
        return here
    beside = os.path.join(os.path.dirname(sys.executable), "pipeprof")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("pipeprof")


def main():
    cmd = _command()
    if cmd is None:
        print(
            "pipeprof: the pipeprof command is not installed with this Python package "
            "(a source build without it?): install the wheel (scripts/build-wheel.sh), "
            "or `cargo install --path .` in the pipeprof repository",
            file=sys.stderr,
        )
        return 127
    os.execv(cmd, [cmd, *sys.argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())

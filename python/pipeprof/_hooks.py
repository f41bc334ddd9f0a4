"""Post-import hooks: a patch runs right after its module is executed, whoever imports it (now,
if it already is), and the one way a patch says it failed (:func:`warn`).

Imports nothing of pipeprof's: the modules that patch import it (``_auto`` hands it the table
of what to patch, ``_override`` and ``_keras_data`` add their own), and the extension calls
:func:`warn` for the bookkeeping it does on the training thread. Nothing here raises into the
program: a hook that fails turns itself off with a line.
"""

from __future__ import annotations

import importlib.abc
import sys


def warn(what, e):
    """Says that ``what`` is not profiled, and why; the program goes on."""
    print(f"pipeprof: {what} is not profiled ({e!r}); the program goes on", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a patch right after a watched module is executed, whoever imports it."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        hook = self.hooks.pop(name)
        # The real spec, from the finders after this one.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                hook(module)
            except Exception as e:  # a framework version we do not know
                warn(name, e)

        loader.exec_module = exec_module
        return spec


def when_imported(hooks):
    """Calls ``hooks[name](module)`` once ``name`` is imported (now, if it already is)."""
    pending = {}
    for name, hook in hooks.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                hook(mod)
            except Exception as e:
                warn(name, e)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, _Finder(pending))

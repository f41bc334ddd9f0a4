"""``pipeprof run``'s zero-code hooks armed in this process for one stretch of code (a notebook
cell, a ``with pipeprof.profile():`` block), and taken out after it: the process outside the
stretch is as it was.

Arming is ``pipeprof._auto.start()``, exactly what ``pipeprof run`` does in a program it starts
(the frameworks already imported are patched at once, the others when they are imported).
Disarming asks nothing of the hook modules: what they changed is found by comparison.

* Before arming, the namespaces the hooks may change are copied: each framework module
  (``torch``, ``torchvision``, ``PIL``, ``fastai`` with ``fasttransform``/``fastcore`` (its item
  transforms), ``cv2``, ``albumentations``, ``keras``, ``tf_keras``, and ``sys`` for its
  ``excepthook``) and each class it defines, as they are now, or for a module imported while
  armed, as its own code left it (:class:`_Watcher`, behind pipeprof's post-import finders, so
  before their patch). After, every entry that changed to one of pipeprof's objects (a
  function of a ``pipeprof`` module, a method of the extension) is put back, and an entry that
  was not there is removed. What the program itself changed meanwhile stays.
* A class of the program's own deriving from a framework class (a Keras ``PyDataset``) had no
  copy taken: a pipeprof function found in it is replaced by the function it wraps
  (``__wrapped__``), or removed where that is what the class inherits anyway.
* Entries of pipeprof's own in a framework module's dicts (torch's global optimizer hooks)
  are removed; pipeprof's post-import finders leave ``sys.meta_path``.
* pipeprof's hook modules keep per-run state (the training loop, which loader was the
  training one, which patches are in): their globals are copied too and put back, containers
  and pipeprof's own state objects in place, so the next stretch starts as the first did.
"""

from __future__ import annotations

import atexit
import importlib.abc
import sys
import threading
import types

#: The packages whose modules pipeprof's hooks patch, and ``sys`` (``excepthook``).
FRAMEWORKS = frozenset(
    {"torch", "torchvision", "PIL", "fastai", "fasttransform", "fastcore", "cv2", "albumentations", "keras", "tf_keras", "sys"}
)

#: pipeprof's modules that hold no hook state: this one and the ones that drive it.
_DRIVERS = frozenset(
    {"pipeprof._native", "pipeprof._arming", "pipeprof._profile", "pipeprof._live", "pipeprof._report", "pipeprof.notebook"}
)

_MISSING = object()


def _pipeprof_name(name):
    return isinstance(name, str) and (name == "pipeprof" or name.startswith("pipeprof."))


def owned(value):
    """Whether ``value`` is pipeprof's: a function or class of a pipeprof module, an object
    of one of its classes (the extension's among them), or a method the extension made."""
    t = type(value)
    if t is types.FunctionType:
        # Where it was written (``functools.wraps`` copies the wrapped one's ``__module__``).
        return _pipeprof_name(value.__globals__.get("__name__"))
    if t is type:
        return _pipeprof_name(vars(value).get("__module__"))
    if t is types.MethodDescriptorType:
        return "pipeprof" in (value.__doc__ or "")
    return _pipeprof_name(getattr(t, "__module__", None))


def _top(name):
    return name.partition(".")[0]


def _is_framework(name):
    return _top(name) in FRAMEWORKS


def _is_hook_state(name):
    return _pipeprof_name(name) and name not in _DRIVERS


# ---------------------------------------------------------------- framework namespaces


class _Frameworks:
    """Copies of the framework namespaces (a module's dict, a class's), by the object that
    owns each, to put pipeprof's entries back from."""

    def __init__(self):
        self.copies = {}  # id(owner) -> (owner, dict copy)

    def take(self, module):
        d = getattr(module, "__dict__", None)
        if d is None or id(module) in self.copies:
            return
        self.copies[id(module)] = (module, dict(d))
        name = module.__name__
        for v in list(d.values()):
            # Never isinstance(): it reads __class__, which some modules' objects warn on.
            if issubclass(type(v), type) and vars(v).get("__module__") == name and id(v) not in self.copies:
                self.copies[id(v)] = (v, dict(vars(v)))

    def restore(self):
        for owner, before in list(self.copies.values()):
            _put_back(owner, before)
            if issubclass(type(owner), types.ModuleType):
                _drop_owned_entries(vars(owner))
        self._program_classes()

    def _program_classes(self):
        """Classes deriving from a framework class that no copy covers: the program's own."""
        seen = set(self.copies)
        stack = [o for o, _ in self.copies.values() if isinstance(o, type)]
        while stack:
            cls = stack.pop()
            try:
                subs = type.__subclasses__(cls)
            except TypeError:
                continue
            for sub in subs:
                if id(sub) in seen:
                    continue
                seen.add(id(sub))
                stack.append(sub)
                _unwrap(sub)


def _put_back(owner, before):
    """Every entry of ``owner`` that became one of pipeprof's objects since ``before``: back."""
    now = vars(owner)
    for key, value in list(now.items()):
        old = before.get(key, _MISSING)
        if value is old or not (owned(value) or (isinstance(key, str) and key.startswith("_pipeprof"))):
            continue
        _restore(owner, key, old)


def _restore(owner, key, old):
    """``owner.key`` set to ``old`` again, or deleted where ``old`` is ``_MISSING``; an entry
    the owner will not let go stays."""
    try:
        if old is _MISSING:
            delattr(owner, key)
        else:
            setattr(owner, key, old)
    except (AttributeError, TypeError):
        pass


def _drop_owned_entries(namespace):
    """pipeprof's functions in a module's dicts (torch's global optimizer step hooks)."""
    function = types.FunctionType
    for value in list(namespace.values()):
        if issubclass(type(value), dict):
            for key in [k for k, v in list(value.items()) if type(v) is function and owned(v)]:
                value.pop(key, None)


def _unwrap(cls):
    """pipeprof's functions in a class it has no copy of: the function each wraps, or nothing
    where the class would inherit that function anyway."""
    for key, value in list(vars(cls).items()):
        if type(value) is not types.FunctionType or not owned(value):
            continue
        inner = getattr(value, "__wrapped__", _MISSING)
        if inner is _MISSING:
            continue
        inherited = next((vars(b)[key] for b in cls.__mro__[1:] if key in vars(b)), _MISSING)
        _restore(cls, key, _MISSING if inner is inherited else inner)


# ---------------------------------------------------------------- pipeprof's hook state


def _copy(value, depth=2):
    """What ``value`` holds now, to put back in place: a container's items, the attributes
    of one of pipeprof's state objects (``depth`` levels down); None for anything else."""
    if depth == 0:
        return None
    t = type(value)
    if t is dict:
        return dict(value)
    if t is list:
        return list(value)
    if t is set:
        return set(value)
    if issubclass(t, (type, types.ModuleType, threading.local)) or callable(value):
        return None
    if not _pipeprof_name(getattr(t, "__module__", None)):
        return None
    attrs = {}
    for name in _attribute_names(value):
        try:
            v = getattr(value, name)
        except AttributeError:
            continue
        attrs[name] = (v, _copy(v, depth - 1))
    return attrs


def _attribute_names(obj):
    names = set(getattr(obj, "__dict__", {}) or {})
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
    names.discard("__dict__")
    names.discard("__weakref__")
    return names


def _put_in_place(value, held):
    if held is None:
        return
    t = type(value)
    if t is dict:
        value.clear()
        value.update(held)
    elif t is list:
        value[:] = held
    elif t is set:
        value.clear()
        value.update(held)
    else:
        for name, (v, inner) in held.items():
            try:
                setattr(value, name, v)
            except (AttributeError, TypeError):
                continue
            _put_in_place(v, inner)


class _HookState:
    """Copies of pipeprof's hook modules' globals."""

    def __init__(self):
        self.copies = {}  # module name -> {key: (value, its contents)}

    def take(self, module):
        if module.__name__ in self.copies:
            return
        self.copies[module.__name__] = {k: (v, _copy(v)) for k, v in vars(module).items() if not k.startswith("__")}

    def restore(self):
        for name, held in self.copies.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            d = vars(module)
            for key, (value, contents) in held.items():
                if type(value) is types.ModuleType:
                    continue
                if d.get(key, _MISSING) is not value:
                    d[key] = value
                _put_in_place(value, contents)


# ---------------------------------------------------------------- modules imported while armed


class _Watcher(importlib.abc.MetaPathFinder):
    """Copies a framework module (or one of pipeprof's) as its own code leaves it, before any
    post-import patch: it sits behind pipeprof's post-import finders (they insert themselves in
    front, and find the real module through the finders after them, this one included)."""

    def __init__(self, taken):
        self.taken = taken
        self.busy = threading.local()

    def find_spec(self, name, path, target=None):
        if not (_is_framework(name) or _is_hook_state(name)) or getattr(self.busy, "on", False):
            return None
        self.busy.on = True
        try:
            spec = None
            for finder in sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else ():
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find else None
                if spec is not None:
                    break
        finally:
            self.busy.on = False
        loader = getattr(spec, "loader", None)
        # A loader that is a class (built-in, frozen modules) is shared: never changed.
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        run, taken = loader.exec_module, self.taken

        def exec_module(module):
            run(module)
            taken(module)

        loader.exec_module = exec_module
        return spec


# ---------------------------------------------------------------- arming


class Armed:
    """The hooks armed now; :meth:`disarm` takes them out."""

    def __init__(self):
        # Imported before anything is copied: their state as they start is what is put back.
        from pipeprof import _auto, _torch_loop  # noqa: F401

        self.frameworks = _Frameworks()
        self.state = _HookState()
        for name, module in list(sys.modules.items()):
            if module is not None:
                self._take(name, module)
        self.meta_path = list(sys.meta_path)
        self.watcher = _Watcher(lambda m: self._take(m.__name__, m))
        sys.meta_path.insert(0, self.watcher)
        self.armed = False
        try:
            _auto.start()
            self.armed = True
        except BaseException:
            self.disarm()
            raise

    def _take(self, name, module):
        if _is_framework(name):
            self.frameworks.take(module)
        elif _is_hook_state(name):
            self.state.take(module)

    def finish_loop(self):
        """What the end of a program does under ``pipeprof run``: the training thread's open
        step is closed, a batch no step took is sent."""
        loop = sys.modules.get("pipeprof._torch_loop")
        if loop is not None and self.armed:
            loop.finish()

    def disarm(self):
        """Everything pipeprof's hooks changed, put back (see the module's doc)."""
        self.armed = False
        loop = sys.modules.get("pipeprof._torch_loop")
        if loop is not None:
            atexit.unregister(loop.finish)
        sys.meta_path[:] = [f for f in sys.meta_path if f in self.meta_path or not owned(f)]
        if self.watcher in sys.meta_path:
            sys.meta_path.remove(self.watcher)
        self.frameworks.restore()
        self.state.restore()

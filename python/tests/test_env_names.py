"""The run's environment names (``PIPEPROF_PARENT``, ``PIPEPROF_CHECK``, ...) are declared once, in
Rust (the probes crate's ``env``), and the Python package reads them from its extension: no
module of the package spells one, except the start-up hook, which runs before pipeprof can be
imported and must spell the names the extension exports."""

import ast
import re
from pathlib import Path

import pipeprof
from pipeprof import _native, _override

PACKAGE = Path(__file__).resolve().parents[1] / "pipeprof"
BOOTSTRAP = PACKAGE / "_bootstrap" / "sitecustomize.py"
NAME = re.compile(r"PIPEPROF_[A-Z0-9_]+")


def exported():
    """The extension's environment names: its ``*_ENV`` constants."""
    return {v for k, v in vars(_native).items() if k.endswith("_ENV") and isinstance(v, str)}


def spelled(path):
    """The environment names a module spells as string constants (its prose aside)."""
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)
    }


def test_the_extension_exports_the_names_the_package_reads():
    names = exported()
    assert {pipeprof.ADDRESS_ENV, pipeprof.TOKEN_ENV, pipeprof.PARENT_PID_ENV} <= names, names
    assert {pipeprof.MAIN_PID_ENV, pipeprof.RANK_MAIN_ENV, _override.ENV} <= names, names
    assert all(NAME.fullmatch(n) for n in names), names


def test_no_module_spells_a_name_the_extension_declares():
    names = exported()
    assert names, "the extension exports no environment name"
    spelt = {p.relative_to(PACKAGE).as_posix(): spelled(p) & names for p in PACKAGE.rglob("*.py") if p != BOOTSTRAP}
    assert {p: s for p, s in spelt.items() if s} == {}


def test_the_start_up_hook_spells_only_names_the_extension_declares():
    hook = spelled(BOOTSTRAP)
    # It reads the run's address and its main program's pid before it imports pipeprof.
    assert hook, "the start-up hook reads no environment name"
    assert hook <= exported(), hook - exported()

"""The steps' Python functions (docs/transforms.md “Functions”): ``module:function`` imported
from the config's ``functions.dir``, checked at load, imported again when its file changes.

The directory is the running config's (``use_dir``, set when the config file is loaded, so that
connectors made over the API find the same functions); its modules import each other as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from core.redact import said

PARAMS = ("action", "record", "changes", "metadata")
_SPEC = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)$")
RELOOK = 1.0  # seconds between looks at a function's file for a change
_dir: Path | None = None
_lock = threading.Lock()
_mtimes: dict[str, float] = {}  # module name: the file's mtime when it was imported


def use_dir(path: Path | None) -> None:
    """Where ``module:function`` is imported from from now on (None: nowhere)."""
    global _dir
    with _lock:
        if _dir is not None and str(_dir) in sys.path:
            sys.path.remove(str(_dir))
        for name in _mtimes:  # the old directory's modules: a name may mean another now
            sys.modules.pop(name, None)
        _mtimes.clear()
        _dir = path
        if path is not None:
            sys.path.append(str(path))  # after the installed modules: none is shadowed


def load(spec: str) -> Callable[..., Any]:
    """The function ``spec`` names, imported anew when its module's file changed since; a
    ValueError says what is wrong and what to fix."""
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(
            said("function %r: write it as module:function (e.g. shaping:redact)", spec)
        )
    if _dir is None:
        raise ValueError(
            said("function %r: set functions.dir to the directory of its module", spec)
        )
    name, attr = m.groups()
    with _lock:
        module = _module(spec, name)
    fn: Callable[..., Any] | None = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ValueError(
            said("function %r: %s (%s) has no function %s", spec, name, module.__file__, attr)
        )
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn  # a builtin's: it is called and its errors said
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL
                and p.kind is not p.VAR_KEYWORD]  # fmt: skip
    if len(required) > len(PARAMS) or (len(positional) < len(PARAMS) and not varargs):
        raise ValueError(
            said(
                "function %r: takes (%s); a step calls it with (%s)",
                spec,
                ", ".join(p.name for p in params),
                ", ".join(PARAMS),
            )
        )
    return fn


_looks = 0  # bumped by relook(): every Loaded looks at its file at its next call


def relook() -> None:
    """Make every function look at its file at its next call: a message retried from a failed
    list runs the function as its file is now, also when fixed within the second."""
    global _looks
    _looks += 1


class Loaded:
    """A function as ``load`` gives it, looked at again (its file's time) once a second at
    most, or after :func:`relook`: a step holds one, so that a fixed function is called from
    the next second on."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.fn: Callable[..., Any] | None = None  # loaded at the first call
        self.next = 0.0
        self.looks = _looks

    def __call__(self) -> Callable[..., Any]:
        """The function; a ValueError saying why when it cannot be loaded (now gone, say):
        its message fails, and the next call looks again."""
        if self.fn is None or time.monotonic() >= self.next or self.looks != _looks:
            self.fn = None
            self.fn = load(self.spec)
            self.next = time.monotonic() + RELOOK
            self.looks = _looks
        return self.fn


def _in_dir(spec: str, name: str) -> None:
    """Refuse a module that is not in the functions' directory, before anything of it runs: an
    installed one's import-time code ran (``this:s`` printed the Zen of Python) before the
    check refused it, also over the API (found by an outside tryout)."""
    assert _dir is not None
    top = name.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except ValueError:  # imported, its file gone since (__spec__ None): look for it anew
        sys.modules.pop(top, None)
        found = importlib.util.find_spec(top)
    origin = None if found is None else (found.origin or next(iter(
        found.submodule_search_locations or []), None))  # fmt: skip
    if origin is None or not Path(origin).resolve().is_relative_to(_dir.resolve()):
        raise ValueError(
            said(
                "function %r: no module %s in %s (functions come from functions.dir only)",
                spec,
                top,
                _dir,
            )
        )


def _module(spec: str, name: str) -> ModuleType:
    assert _dir is not None
    _in_dir(spec, name)
    module = sys.modules.get(name)
    try:
        if module is None:
            module = importlib.import_module(name)
        elif _mtime(module) != _mtimes.get(name):  # changed since: fixed, say
            module = importlib.reload(module)
        _mtimes[name] = _mtime(module)
        return module
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise ValueError(said("function %r: no module %s in %s", spec, e.name, _dir)) from None
        raise ValueError(said("function %r: %s imports %s, which is missing%s", spec, name,
                              e.name, _where(e))) from None  # fmt: skip
    except Exception as e:
        where = _where(e)
        raise ValueError(
            said(
                "function %r: importing %s failed%s: %s: %s", spec, name, where, type(e).__name__, e
            )
        ) from None


def _mtime(module: ModuleType) -> float:
    try:
        return os.stat(module.__file__ or "").st_mtime
    except OSError:
        return 0.0


def _where(e: BaseException) -> str:
    """`` at file:line`` of a syntax error, or of the innermost frame of an error in the
    functions' directory (an import's error is raised in importlib's own frames), else of
    the innermost frame."""
    if isinstance(e, SyntaxError) and e.filename:
        return said(" at %s:%s", e.filename, e.lineno)
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    mine = [f for f in frames if _dir is not None and f[0].startswith(str(_dir))]
    if not (mine or frames):
        return ""
    return said(" at %s:%s", *(mine or frames)[-1])

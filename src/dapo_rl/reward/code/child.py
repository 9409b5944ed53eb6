"""The code reward's programs: the text that runs in the sandbox, never imported by the trainer.

`dapo_rl.reward.code.programs` reads this file as text, appends one call (`call_main`, `record_main` or
`replay_main`, its arguments as Python literals) and hands the whole to `dapo_rl.sandbox.ProgramRunner`. It imports
only the standard library (a sandboxed child reads nothing but the Python installation).

Three programs:

- **call** (`call_main`): loads the model's code as a module named ``solution`` and calls one of its functions on
  each test's arguments, one line per test on standard output: the value it returned, serialised (`encode`), or
  what went wrong (raised, ran past the test's time, exited, returned something that is not plain data). It never
  sees an expected output and compares nothing: the parent decides (`dapo_rl.reward.code.scorer`).
- **record** (`record_main`): runs a HumanEval-style ``check(candidate)`` against a recording candidate to learn the
  arguments the check passes (the model's code is not in this process).
- **replay** (`replay_main`): runs the same ``check(candidate)`` against a candidate that answers from the values
  the model's function returned (data only; the model's code is not in this process either), and reports whether
  the check passed.

Values cross processes as tagged JSON: ``null``, booleans, integers, finite floats, strings and lists stand for
themselves; ``{"t": [...]}`` is a tuple, ``{"d": [[k, v], ...]}`` a dict, ``{"s": [...]}`` a set (elements in one
order), ``{"fs": [...]}`` a frozenset, ``{"f": "inf"}`` a non-finite float, ``{"h": "0x..."}`` an integer of more
than 12,000 bits, ``{"b": "hex"}`` bytes, ``{"c": [re, im]}`` a complex number. Only built-in data crosses: an
instance of a subclass of a built-in type (a ``Counter``, a namedtuple) is read as its base type's value through the
base type's own methods, and an object whose class overrides comparison or hashing (a class whose ``__eq__`` always
says yes, a subclass of ``int`` that does), or of any other class, is reported as ``foreign``: no object of the
model's making ever reaches a comparison.
"""

import ast as _ast
import builtins as _builtins
import io as _io
import json as _json
import os as _os
import random as _random
import signal as _signal
import sys as _sys
import time as _time
import types as _types

MAX_DEPTH = 100
"""Deepest nesting of containers a value may have."""

_TYPE, _LIST, _TUPLE, _DICT, _SET, _FROZENSET = type, list, tuple, dict, set, frozenset
_INT, _FLOAT, _STR, _BYTES, _COMPLEX, _BOOL = int, float, str, bytes, complex, bool
_ISINSTANCE, _LEN, _REPR, _GETATTR = isinstance, len, repr, getattr
_DUMPS, _LOADS, _WRITE = _json.dumps, _json.loads, _os.write
_SETITIMER, _ITIMER_REAL, _SIGALRM = _signal.setitimer, _signal.ITIMER_REAL, _signal.SIGALRM
_SIGNAL, _MONOTONIC = _signal.signal, _time.monotonic
_BUILTIN_TYPES = (int, float, str, bytes, complex, bool, list, tuple, dict, set, frozenset)


class Foreign(Exception):
    """A value outside the plain built-in types (`args[0]`: its type's name; `args[1]`: whether its class overrides
    comparison or hashing, or subclasses a built-in type: an always-equal object's marks)."""


class TestTimeout(BaseException):
    """The test's time ran out (SIGALRM)."""


def _on_alarm(signum, frame):
    raise TestTimeout()


STDLIB_CLASSES = ("collections", "builtins")
"""Modules whose subclasses of built-in types (``Counter``, ``OrderedDict``, ``defaultdict``) are trusted to compare
as their data does; a namedtuple class, made in the model's module, overrides nothing and is read as its tuple."""

_LAUNDER = (
    (_DICT, lambda v: _DICT(_DICT.items(v))),
    (_LIST, lambda v: _LIST.__getitem__(v, slice(None))),
    (_TUPLE, lambda v: _TUPLE.__getitem__(v, slice(None))),
    (_FROZENSET, lambda v: _FROZENSET(_FROZENSET.__iter__(v))),
    (_SET, lambda v: _SET(_SET.__iter__(v))),
    (_STR, lambda v: _STR.__str__(v)),
    (_INT, lambda v: _INT.__int__(v)),
    (_FLOAT, lambda v: _FLOAT.__float__(v)),
    (_BYTES, lambda v: _BYTES.__getitem__(v, slice(None))),
)
"""Per built-in base type, its value of an instance of a subclass, through the base type's own methods (none of the
subclass's methods runs)."""


def _suspicious(t):
    """Whether a class looks made to pass comparisons: it, or a base other than `object`, a built-in type or a class
    of `STDLIB_CLASSES`' modules, defines ``__eq__``, ``__ne__`` or ``__hash__``."""
    try:
        for base in t.__mro__:
            if base is object or base in _BUILTIN_TYPES:
                continue
            if _GETATTR(base, "__module__", "") in STDLIB_CLASSES:
                continue
            if any(k in base.__dict__ for k in ("__eq__", "__ne__", "__hash__")):
                return True
    except BaseException:
        return True
    return False


def _sorted_items(items):
    """Set elements in one order in every process (string hashing differs between processes)."""
    return sorted(items, key=_DUMPS)


def encode(v, depth=0):
    """`v` as tagged JSON data (see the module docstring). An instance of a subclass of a built-in type is read as its
    base type's value (`_LAUNDER`) unless its class overrides comparison or hashing (`_suspicious`); raises
    `Foreign` for that and for anything else."""
    if depth > MAX_DEPTH:
        raise Foreign(f"nesting deeper than {MAX_DEPTH}", False)
    t = _TYPE(v)
    if v is None or t is _BOOL or t is _STR:
        return v
    if t is _INT:
        return {"h": hex(v)} if v.bit_length() > 12000 else v  # past ~3600 digits: JSON readers refuse them
    if t is _FLOAT:
        if v != v or v in (float("inf"), float("-inf")):
            return {"f": _REPR(v)}
        return v
    if t is _LIST:
        return [encode(x, depth + 1) for x in v]
    if t is _TUPLE:
        return {"t": [encode(x, depth + 1) for x in v]}
    if t is _DICT:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is _SET:
        return {"s": _sorted_items([encode(x, depth + 1) for x in v])}
    if t is _FROZENSET:
        return {"fs": _sorted_items([encode(x, depth + 1) for x in v])}
    if t is _BYTES:
        return {"b": v.hex()}
    if t is _COMPLEX:
        return {"c": [encode(v.real, depth + 1), encode(v.imag, depth + 1)]}
    mod = _GETATTR(t, "__module__", "")
    if mod == "numpy" and hasattr(v, "item"):  # a numpy scalar: its Python value (still checked by type)
        return encode(v.item(), depth + 1)
    if not _suspicious(t):
        for base, value in _LAUNDER:
            if _ISINSTANCE(v, base):
                return encode(value(v), depth + 1)
    raise Foreign(_GETATTR(t, "__qualname__", "?"), _suspicious(t))


def decode(v, depth=0):
    """`encode`'s data back to values (ValueError on anything that is not such data)."""
    if depth > MAX_DEPTH + 2:
        raise ValueError("nesting too deep")
    t = _TYPE(v)
    if v is None or t in (_BOOL, _STR, _INT, _FLOAT):
        return v
    if t is _LIST:
        return [decode(x, depth + 1) for x in v]
    if t is _DICT and _LEN(v) == 1:
        ((tag, x),) = v.items()
        if tag == "t":
            return tuple(decode(y, depth + 1) for y in x)
        if tag == "d":
            return {decode(k, depth + 1): decode(y, depth + 1) for k, y in x}
        if tag == "s":
            return {decode(y, depth + 1) for y in x}
        if tag == "fs":
            return frozenset(decode(y, depth + 1) for y in x)
        if tag == "f" and x in ("inf", "-inf", "nan"):
            return float(x)
        if tag == "h" and _TYPE(x) is _STR:
            return int(x, 16)
        if tag == "b":
            return bytes.fromhex(x)
        if tag == "c":
            return complex(decode(x[0], depth + 1), decode(x[1], depth + 1))
    raise ValueError("not a tagged value")


def key_of(args, kwargs):
    """The text that names one call's arguments (the same in every program: `json.dumps` of the tagged data)."""
    return _DUMPS([encode(list(args)), encode(dict(sorted(kwargs.items())))])


class _Emitter:
    def __init__(self, nonce):
        self.nonce = nonce

    def __call__(self, obj):
        data = (self.nonce + _DUMPS(obj) + "\n").encode()
        while data:
            data = data[_WRITE(1, data) :]


class _Sink(_io.TextIOBase):
    """Where a tested function's prints go (nowhere: only the returned values count)."""

    def write(self, s):
        return _LEN(s)

    def writable(self):
        return True


_GUARDED = (
    (_sys, "exit"),
    (_os, "_exit"),
    (_os, "write"),
    (_json, "dumps"),
    (_signal, "setitimer"),
)
"""Module functions the harness reports with or relies on: replacing one counts as tampering."""


def _guard_names(_vars=vars, _dict=dict, _getattr=getattr):
    """What the program checks for tampering: the builtins, its own globals, and `_GUARDED`'s functions."""
    return (
        _dict(_vars(_builtins)),
        _dict(globals()),
        [_getattr(m, name) for m, name in _GUARDED],
    )


def _tampered(before, _vars=vars, _getattr=getattr, _len=len):
    """The names that changed since `before` (`_guard_names`'s), at most 20 (patched builtins or harness
    functions); all of them are put back, so the harness can still report. Uses no builtin looked up at call time."""
    old_b, old_g, old_f = before
    new_b, new_g = _vars(_builtins), globals()
    out = []
    for scope, old, new in (("builtins", old_b, new_b), ("globals", old_g, new_g)):
        for k in old:
            if k not in new or new[k] is not old[k]:
                out.append(scope + "." + k)
        for k in new:
            if k not in old and k != "_":
                out.append(scope + "." + k)
    for (m, name), f in zip(_GUARDED, old_f):
        if _getattr(m, name, None) is not f:
            out.append(m.__name__ + "." + name)
            setattr(m, name, f)
    if out:
        new_b.clear()
        new_b.update(old_b)
        new_g.clear()
        new_g.update(old_g)
    return out[:20]


def _emit_tampered(nonce, i, names):
    """The line that reports tampering, written without `json` (whose module the program may have changed)."""
    clean = ['"' + "".join(c for c in n if c.isalnum() or c in "._")[:80] + '"' for n in names]
    head = "" if i is None else '"i": ' + str(int(i)) + ", "
    data = (nonce + "{" + head + '"tampered": [' + ", ".join(clean) + "]}\n").encode()
    while data:
        data = data[_os.write(1, data) :]


def _alarm(seconds):
    try:
        _SETITIMER(_ITIMER_REAL, seconds)
    except BaseException:
        pass


def call_main(nonce, code, calls, fn_name, test_s, load_s, value_bytes):
    """The call program: load `code`, call `fn_name` on each of `calls` (tagged ``[args, kwargs]`` pairs), one line
    per call; ``{"done": true}`` after the last.

    Lines (each prefixed with `nonce`): ``{"compile_error": str}``, ``{"load_error": str}`` (the module raised,
    timed out, or has no such function), ``{"exit": "load"}``, ``{"tampered": [names]}``, then per call
    ``{"i": i, "value": data}`` | ``{"i": i, "raised": name}`` | ``{"i": i, "timeout": true}`` |
    ``{"i": i, "exit": true}`` | ``{"i": i, "foreign": name, "suspicious": bool}`` | ``{"i": i, "too_large":
    bytes}`` (the value's JSON would pass the `value_bytes` left of the output cap: the report stays whole, so an
    honest function returning a huge value is a wrong answer, not a flood), each possibly with ``"tampered":
    [names]`` (the program stops there).
    """
    emit = _Emitter(nonce)
    _SIGNAL(_SIGALRM, _on_alarm)
    _sys.stdout = _sys.stderr = (
        _Sink()
    )  # only the returned values count (and output cannot crowd out the report)
    _sys.stdin = _io.StringIO("")
    try:
        _sys.set_int_max_str_digits(0)
    except AttributeError:
        pass
    try:
        compiled = compile(code, "<solution>", "exec")
    except BaseException as e:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        emit({"compile_error": (f"{_TYPE(e).__name__}: {e}")[:300]})
        return
    before = _guard_names()
    module = _types.ModuleType("solution")
    _sys.modules["solution"] = module
    _alarm(load_s)
    try:
        exec(compiled, module.__dict__)  # noqa: S102 (the sandboxed child: this is what it is for)
    except TestTimeout:
        _alarm(0)
        emit({"load_error": "timeout"})
        return
    except SystemExit:
        _alarm(0)
        emit({"exit": "load"})
        return
    except BaseException as e:
        _alarm(0)
        emit({"load_error": _TYPE(e).__name__[:100]})
        return
    _alarm(0)
    changed = _tampered(before)
    if changed:
        _emit_tampered(nonce, None, changed)
        return
    fn = module.__dict__.get(fn_name)
    if fn is None and _ISINSTANCE(module.__dict__.get("Solution"), _TYPE):  # LeetCode's form
        try:
            fn = _GETATTR(module.__dict__["Solution"](), fn_name, None)
        except BaseException:
            fn = None
    if not callable(fn):
        emit({"load_error": f"NameError: no function {fn_name!r}"})
        return
    for i, pair in enumerate(calls):
        args, kwargs = decode(pair[0]), decode(pair[1])
        out = {"i": i}
        _SIGNAL(_SIGALRM, _on_alarm)  # the model's code may have replaced or ignored the handler
        t0 = _MONOTONIC()
        _alarm(test_s)
        try:
            got = fn(*args, **kwargs)
            out["value"] = encode(got)
            size = _LEN(_DUMPS(out["value"]))
            if _MONOTONIC() - t0 > test_s:  # past its time with the alarm ignored, blocked or cancelled
                out = {"i": i, "timeout": True}
            elif size > value_bytes:  # a value past what is left of the output cap: reported as such, not cut
                out = {"i": i, "too_large": size}
            else:
                value_bytes -= size
        except TestTimeout:
            out = {"i": i, "timeout": True}
        except SystemExit:
            out = {"i": i, "exit": True}
        except Foreign as e:
            out = {"i": i, "foreign": str(e.args[0])[:100], "suspicious": bool(e.args[1])}
        except BaseException as e:
            out = {"i": i, "raised": _TYPE(e).__name__[:100]}
        _alarm(0)
        changed = _tampered(before)
        if changed:
            _emit_tampered(nonce, i, changed)
            return
        emit(out)
        if "exit" in out:
            return
    emit({"done": True})


class _Anything:
    """What the recording candidate returns: anything a check may do with a result works, and says nothing."""

    def __getattr__(self, name):
        return self

    def __call__(self, *a, **k):
        return self

    def __getitem__(self, k):
        return self

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __float__(self):
        return 0.0

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return False

    def __lt__(self, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __str__(self):
        return ""

    def _same(self, *a):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __abs__ = _same
    __pos__ = __round__ = _same


class _Soft(_ast.NodeTransformer):
    """Every statement of a function body runs on when it raises (recording only: all the calls get made)."""

    def _wrap(self, body):
        out = []
        for stmt in body:
            stmt = self.visit(stmt)
            handler = _ast.ExceptHandler(
                type=_ast.Name("Exception", _ast.Load()), name=None, body=[_ast.Pass()]
            )
            out.append(_ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[]))
        return out

    def visit_FunctionDef(self, node):
        node.body = self._wrap(node.body)
        return node

    def visit_For(self, node):
        node.body = self._wrap(node.body)
        return node

    visit_While = visit_For

    def visit_If(self, node):
        node.body = self._wrap(node.body)
        node.orelse = self._wrap(node.orelse)
        return node

    def visit_With(self, node):
        node.body = self._wrap(node.body)
        return node


def _check_namespace(prompt, test, entry_point, candidate, soft):
    """The check's globals: the prompt's helpers, the test's definitions, and the entry point's name bound to the
    candidate (a check may call the function by its name, as HumanEval/33 does: in the usual harness that name is
    the model's function)."""
    ns = {"__name__": "__checker__"}
    exec(compile(prompt, "<prompt>", "exec"), ns)  # noqa: S102 (the dataset's prompt: helpers the check uses)
    tree = _ast.parse(test)
    if soft:
        tree = _ast.fix_missing_locations(_Soft().visit(tree))
    exec(compile(tree, "<test>", "exec"), ns)  # noqa: S102 (the dataset's test, without the model's code)
    ns[entry_point] = candidate
    return ns


def record_main(nonce, prompt, test, entry_point):
    """The record program: ``check(candidate)`` with a candidate that notes its arguments; one line
    ``{"calls": [[args, kwargs], ...]}`` (tagged, each distinct call once, in order) or ``{"error": str}``."""
    emit = _Emitter(nonce)
    _sys.stdout = _Sink()
    calls, seen = [], set()

    def candidate(*args, **kwargs):
        key = key_of(args, kwargs)
        if key not in seen:
            seen.add(key)
            calls.append([encode(list(args)), encode(dict(sorted(kwargs.items())))])
        return _Anything()

    _random.seed(0)
    try:
        ns = _check_namespace(prompt, test, entry_point, candidate, soft=True)
        ns["check"](candidate)
    except Foreign as e:
        emit({"error": f"a test argument is not plain data ({e.args[0]})"})
        return
    except BaseException as e:
        if not calls:
            emit({"error": f"the check raised {_TYPE(e).__name__} before any call"})
            return
    emit({"calls": calls})


class Unrecorded(Exception):
    """The check called the candidate with arguments the call program was not given."""


class CandidateFailed(Exception):
    """The model's function did not return a value on these arguments (raised, timed out, not plain data)."""


def replay_main(nonce, prompt, test, entry_point, table):
    """The replay program: ``check(candidate)`` with a candidate answering from `table` (`key_of` text ->
    ``{"value": tagged}``, or ``{"raised": name}`` (raised again as that built-in exception), or any other entry
    where the function gave no value (`CandidateFailed`)). One line: ``{"passed": true}``, ``{"passed": false, "why":
    str}`` or ``{"missing": [[args, kwargs], ...]}`` (calls not in `table`: the parent runs them and replays
    again)."""
    emit = _Emitter(nonce)
    _sys.stdout = _Sink()
    missing = []

    def candidate(*args, **kwargs):
        key = key_of(args, kwargs)
        if key not in table:
            missing.append([encode(list(args)), encode(dict(sorted(kwargs.items())))])
            raise Unrecorded()
        entry = table[key]
        if "value" in entry:
            return decode(entry["value"])
        raised = _GETATTR(_builtins, str(entry.get("raised", "")), None)
        if _ISINSTANCE(raised, _TYPE) and issubclass(raised, Exception):  # as the function raised it
            raise raised("raised by the tested function")
        raise CandidateFailed(str(entry))

    _random.seed(0)
    try:
        ns = _check_namespace(prompt, test, entry_point, candidate, soft=False)
        ns["check"](candidate)
    except Unrecorded:
        emit({"missing": missing})
        return
    except AssertionError:
        emit({"passed": False, "why": "assertion"})
        return
    except BaseException as e:
        if missing:
            emit({"missing": missing})
            return
        emit({"passed": False, "why": _TYPE(e).__name__[:100]})
        return
    if missing:  # the check caught the miss itself
        emit({"missing": missing})
        return
    emit({"passed": True})

"""Catch a submission that tampers with the tests from inside its kernel, so tampering earns nothing.

The kernel runs the student's Python, and the test cells run in the same interpreter, so a
student can replace ``grading.check_equal``, patch ``builtins.isinstance`` or
``torch.testing.assert_close``, make IPython report every cell as a success, add an input
transformer that empties the test cells, or switch the profiler off under
``check_not_calling``. :class:`gpulab.course.execute.SandboxedExecute` runs three probes that the
student never sees, with code sent by the grader (nothing is kept in the kernel between them):

1. :func:`fingerprint_code`, once before the first cell: the identity (``id``) and the code
   (a hash of its bytecode, constants and names) of the tests' tools: gpulab.grading's helpers and the
   globals they use, torch's comparisons, the builtins, ``sys``'s profiler and display hooks,
   IPython's ``run_cell`` path, ``ExecutionResult``, its input transformers and event callbacks.
   The grader keeps that snapshot outside the kernel.
2. After each test cell, the same fingerprint again; :func:`compare` names every tool that changed.
3. After each test cell, :func:`canary_code`: checks of unequal values with a random nonce through
   the same ``grading`` name and helpers the tests use (``check``, ``check_equal``,
   ``check_close``, ``check_not_calling`` on a *copy* of a reference...). Every one must fail, and
   the last statement must raise a ``GradingError`` whose exact message :func:`canary_verdict`
   knows, both in the kernel's execute reply and as a displayed error. A kernel that reports
   success, hides the error, or lets one check pass was tampered with.

A tampered test cell scores 0 with a ``TamperError`` output, and the note says why. These probes
run inside the student's interpreter, so a student who studies this file could forge their
answers; the static scan (:mod:`gpulab.course.scan`) flags the code such forging needs, and the
note sends the submission to a human.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Sequence

TAMPERED = "TamperError"

# Runs in the kernel; prints one JSON line. Python functions: [id, hash of the code]; others: [id].
_FINGERPRINT = r'''
def __gpulab_fp(preload):
    import builtins, hashlib, importlib, json, sys, threading
    import gpulab.grading, torch.testing  # noqa: F401 - the tests' tools, loaded before any student code
    for name in preload:  # the lab's graders, and the instruments they import, before any student code
        try:
            importlib.import_module(name)
        except Exception:
            pass
    out = {}

    def content(code):  # what the code does (marshal's bytes depend on reference counts)
        consts = tuple(content(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts)
        return repr((code.co_code, consts, code.co_names, code.co_varnames))

    def add(key, obj):
        fn = getattr(obj, "__func__", obj)
        code = getattr(fn, "__code__", None)
        out[key] = [id(fn), hashlib.sha256(content(code).encode()).hexdigest()[:16] if code is not None else None]

    def add_vars(prefix, ns, only_callables=False):
        for name, value in list(vars(ns).items()):
            if only_callables and not callable(value):
                continue
            if name.startswith("__") and name not in ("__import__", "__build_class__"):
                continue
            add(prefix + name, value)

    def add_code(prefix, ns):  # the functions and methods a module defines (its other globals may change)
        for name, value in list(vars(ns).items()):
            if getattr(value, "__module__", None) != ns.__name__:
                continue
            if isinstance(value, type):
                for attr, member in list(vars(value).items()):
                    member = getattr(member, "__func__", getattr(member, "fget", member))
                    if hasattr(member, "__code__"):
                        add(prefix + name + "." + attr, member)
            elif hasattr(value, "__code__"):
                add(prefix + name, value)

    graders = [m for m in sys.modules if m.startswith("gpulab.grading.")]
    for mod in ("gpulab.grading", *graders, "torch.testing", "torch.testing._comparison"):
        if mod in sys.modules:
            add("module:" + mod, sys.modules[mod])
            add_vars(mod + ".", sys.modules[mod])
    for mod in [m for m in sys.modules if m.startswith("gpulab.") and not m.startswith(("gpulab.grading", "gpulab.course"))]:
        if sys.modules[mod] is not None:
            add_code(mod + ".", sys.modules[mod])
    torch = sys.modules.get("torch")
    if torch is not None:
        add("module:torch", torch)
        for name in ("allclose", "isclose", "equal", "is_tensor", "full", "zeros", "tensor", "device", "Tensor"):
            add("torch." + name, getattr(torch, name, None))
        add_vars("torch.Tensor.", torch.Tensor, only_callables=True)
    add_vars("builtins.", builtins, only_callables=True)
    for name in ("setprofile", "settrace", "getprofile", "gettrace", "displayhook", "excepthook", "audit"):
        add("sys." + name, getattr(sys, name, None))
    add("sys.profiler", sys.getprofile())
    add("sys.tracer", sys.gettrace())
    add("threading.setprofile", threading.setprofile)
    shell = get_ipython()  # noqa: F821 - the kernel's IPython
    from IPython.core import interactiveshell
    for cls in (interactiveshell.ExecutionResult, interactiveshell.ExecutionInfo):
        add_vars("IPython." + cls.__name__ + ".", cls)
    for name in ("run_cell", "run_cell_async", "_run_cell", "run_ast_nodes", "run_code", "transform_cell",
                 "showtraceback", "_showtraceback", "showsyntaxerror", "get_exception_only", "displayhook",
                 "display_pub", "compile", "input_transformer_manager", "events", "kernel"):
        add("shell." + name, getattr(shell, name, None))
    add("shell.displayhook.__call__", type(shell.displayhook).__call__)
    add("shell.displayhook.write_format_data", type(shell.displayhook).write_format_data)
    add("shell.display_pub.publish", type(shell.display_pub).publish)
    for name in ("do_execute", "execute_request", "send_response"):
        add("kernel." + name, getattr(shell.kernel, name, None))
    add("session.send", getattr(shell.kernel.session, "send", None))
    for name in ("input_transformers_cleanup", "input_transformers_post", "ast_transformers"):
        out["list:" + name] = [id(t) for t in getattr(shell, name, [])]
    itm = shell.input_transformer_manager
    for name in ("cleanup_transforms", "line_transforms", "token_transformers"):
        out["list:itm." + name] = [id(t) for t in getattr(itm, name, [])]
    out["events"] = {event: [[id(getattr(cb, "__func__", cb)), str(getattr(cb, "__module__", ""))] for cb in cbs]
                     for event, cbs in shell.events.callbacks.items()}
    ns = shell.user_ns
    out["aliases"] = {name: id(ns[name]) for name in ("grading", "torch") if name in ns}
    print("__GPULAB_FP__" + json.dumps(out))


__gpulab_fp(__GPULAB_PRELOAD__)
del __gpulab_fp
'''

_CANARY = r'''
def __gpulab_canary(n):
    import sys, types
    import torch
    g = grading if "grading" in globals() else sys.modules["gpulab.grading"]  # noqa: F821 - the tests' own name

    def ref(x):
        """A reference: its copies count as it."""
        return [x, x + 1, "a reference"]

    copy = types.FunctionType(ref.__code__.replace(co_name="mine"), {})

    def student(x):
        return copy(x)

    trials = [
        lambda: g.check(n == n + 1, f"canary {n}"),
        lambda: g.check_equal(n, n + 1, what=f"canary {n}"),
        lambda: g.check_equal([str(n)], [str(n + 1)], what=f"canary {n}"),
        lambda: g.check_close(torch.full((3,), float(n)), torch.full((3,), 1.5 * n), what=f"canary {n}"),
        lambda: g.check_close(float(n), 1.5 * n, what=f"canary {n}"),
        lambda: g.check_shape(torch.zeros(2), (3,), what=f"canary {n}"),
        lambda: g.check_between(float(n), 2.0 * n, None, what=f"canary {n}"),
        lambda: g.check_raises(ValueError, int, str(n), what=f"canary {n}"),
        lambda: g.check_not_calling(student, n, forbidden=[ref], what=f"canary {n}"),
        lambda: g.check_not_calling(ref, n, forbidden=[ref], what=f"canary {n}"),
    ]
    caught = 0
    for trial in trials:
        try:
            trial()
        except g.GradingError as err:
            caught += f"canary {n}" in str(err)
    return caught


__gpulab_canary_caught = __gpulab_canary(NONCE)
del __gpulab_canary
(grading if "grading" in globals() else __import__("sys").modules["gpulab.grading"]).check_equal(  # noqa: F821
    __gpulab_canary_caught, -NONCE, what="canary NONCE")
'''
CANARY_TRIALS = 10


def fingerprint_code(preload: Sequence[str] = ()) -> str:
    """The probe that prints the kernel's fingerprint of the tests' tools (one JSON line): gpulab.grading
    and every grader module loaded (``preload`` imports the lab's own first), the functions and methods of
    the gpulab modules loaded with them (the instruments the graders run), torch's comparisons, the
    builtins, the profiler and display hooks, IPython's cell machinery."""
    return _FINGERPRINT.replace("__GPULAB_PRELOAD__", repr(tuple(preload)))


def grader_modules(lab: str | None) -> tuple[str, ...]:
    """The grader module of a lab id (``"06_ddp"`` -> ``("gpulab.grading.lab06",)``), for the snapshot."""
    match = re.match(r"(\d\d)_", lab or "")
    return (f"gpulab.grading.lab{match.group(1)}",) if match else ()


def parse_fingerprint(stdout: str) -> dict[str, Any] | None:
    """The fingerprint printed by :func:`fingerprint_code`, None when it is not there."""
    for line in stdout.splitlines():
        if line.startswith("__GPULAB_FP__"):
            try:
                return json.loads(line[len("__GPULAB_FP__"):])
            except ValueError:
                return None
    return None


def _allowed_callback(module: str) -> bool:
    # matplotlib registers a post_execute hook when pyplot is imported; IPython and ipykernel their own;
    # ray.init() one that flushes its workers' logs after each cell (lab 10). A student's callback
    # that claims one of these modules is still caught by the canary, and by the static scan's
    # "IPython events" pattern.
    return module.split(".")[0] in ("matplotlib", "matplotlib_inline", "IPython", "ipykernel", "ray")


def compare(before: dict[str, Any], now: dict[str, Any] | None) -> list[str]:
    """The tools that changed between the snapshot ``before`` and ``now`` (empty: none)."""
    if now is None:
        return ["the fingerprint probe printed nothing (the kernel's output was intercepted)"]
    changed = []
    for key, value in before.items():
        if key in ("events", "aliases"):
            continue
        if key.startswith("list:"):
            if now.get(key) != value:
                changed.append(key[5:])
        elif key in now and now[key] != value:
            changed.append(key)
        elif key not in now and not key.startswith(("torch.Tensor.", "builtins.")):
            changed.append(f"{key} (replaced or removed)")
    new_builtins = [k for k in now if k.startswith("builtins.") and k not in before]
    changed += [f"{k} (added)" for k in new_builtins]
    modules = {"grading": before.get("module:gpulab.grading"), "torch": before.get("module:torch")}
    for name, ident in now.get("aliases", {}).items():
        if modules.get(name) and ident != modules[name][0]:
            changed.append(f"the notebook's name {name!r} is not the real module")
    for event, callbacks in now.get("events", {}).items():
        old = {tuple(cb) for cb in before.get("events", {}).get(event, [])}
        for ident, module in callbacks:
            if (ident, module) not in old and not _allowed_callback(module):
                changed.append(f"IPython event {event!r} has a new callback")
    return list(dict.fromkeys(changed))


def new_nonce() -> int:
    """A random nonce for one canary (fresh for every test cell, so no answer can be replayed)."""
    return random.SystemRandom().randrange(10**6, 10**9)


def canary_code(nonce: int) -> str:
    """The canary cell for ``nonce``: every check in it must fail."""
    return _CANARY.replace("NONCE", str(nonce))


def canary_expected(nonce: int) -> str:
    """The exact message of the canary's final, failing check when nothing was tampered with."""
    return f"canary {nonce}: expected {-nonce}, got {CANARY_TRIALS}"


def canary_verdict(nonce: int, reply: dict[str, Any] | None, errors: list[dict[str, Any]]) -> str | None:
    """Why the canary shows tampering (None: it failed exactly as it must).

    Args:
        nonce: the canary's nonce.
        reply: the content of the kernel's ``execute_reply``.
        errors: the contents of the ``error`` messages the kernel published for the canary.
    """
    if reply is None:
        return "the canary got no reply"
    if reply.get("status") != "error":
        return "a check that must fail passed (the kernel reported success)"
    expected = canary_expected(nonce)
    if reply.get("ename") != "GradingError" or reply.get("evalue") != expected:
        return f"a check that must fail passed or failed differently ({reply.get('ename')}: {reply.get('evalue', '')[:80]})"
    if not any(e.get("ename") == "GradingError" and e.get("evalue") == expected for e in errors):
        return "the canary's error was not recorded (errors are hidden from the notebook)"
    return None

"""``python -m gpulab <command>``: the kit's command line.

Commands are imported lazily, so ``doctor`` works even when an optional part is broken.

    python -m gpulab doctor [--json]     versions, devices, problems and their fixes
    python -m gpulab profile             profile a bundled demo loop (lab 01); --trace FILE also
                                         writes its torch.profiler trace (open it in ui.perfetto.dev)
    python -m gpulab grade ...           autograde a class (same as `make grade`)
"""

from __future__ import annotations

import importlib
import sys

# command -> ("module", "function taking argv and returning an exit status", "one-line help")
COMMANDS: dict[str, tuple[str, str, str]] = {
    "doctor": ("gpulab.devices.doctor", "main", "report versions, devices, problems and fixes"),
    "profile": ("gpulab.profiling.loop", "main", "profile a demo training loop and print the breakdown (--trace FILE: a Perfetto trace)"),
    "grade": ("gpulab.autograde.__main__", "main", "autograde submissions and export grades.csv"),
}


def _usage() -> str:
    rows = "\n".join(f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items())
    return f"usage: python -m gpulab <command> [options]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        entry = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as err:
        print(f"`{name}` is not available in this install ({err}); run `make setup` to reinstall.", file=sys.stderr)
        return 2
    return int(entry(rest) or 0)

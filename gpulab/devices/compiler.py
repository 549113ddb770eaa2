"""Is there a C++ compiler for torch.compile? On a CPU, inductor writes C++ and builds it (lab 12).

    python -m gpulab doctor        # reports it, with the fix
    python -c "from gpulab.devices.compiler import require_cxx_compiler; print(require_cxx_compiler())"

Inductor looks for the compiler named by ``$CXX``, else ``g++`` (``clang++`` on macOS)
(``torch._inductor.config.cpp.cxx``). Without one, the first compiled call fails deep inside
inductor with ``InvalidCxxCompiler``; this module says what is missing first. A GPU compiles
Triton kernels instead, which needs no C++ compiler for the kernels themselves.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["cxx_compiler_name", "find_cxx_compiler", "missing_compiler_fix", "MissingCompilerError",
           "require_cxx_compiler"]


class MissingCompilerError(RuntimeError):
    """torch.compile on a CPU needs a C++ compiler, and none was found."""


def cxx_compiler_name() -> str:
    """The compiler inductor will run: ``$CXX``, else ``g++`` (``clang++`` on macOS)."""
    return os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")


def find_cxx_compiler() -> str | None:
    """The path of that compiler, or None when it is not on PATH."""
    return shutil.which(cxx_compiler_name())


def missing_compiler_fix(platform: str = sys.platform) -> str:
    """How to install a C++ compiler on ``platform`` (``sys.platform``)."""
    if platform == "darwin":
        return "install Apple's command line tools: xcode-select --install (gives clang++)"
    if platform.startswith("win"):
        return "install Visual Studio's Build Tools (the C++ workload) and run from its developer prompt"
    return ("install g++: sudo apt-get install g++ (Debian/Ubuntu), sudo dnf install gcc-c++ (Fedora), "
            "or conda install -c conda-forge gxx; or point $CXX at a compiler you have")


def require_cxx_compiler() -> str:
    """The compiler's path.

    Raises:
        MissingCompilerError: naming the compiler looked for and the fix, when there is none.
    """
    path = find_cxx_compiler()
    if path is None:
        raise MissingCompilerError(f"torch.compile on a CPU needs a C++ compiler, and `{cxx_compiler_name()}` is not "
                                   f"on PATH: {missing_compiler_fix()}")
    return path

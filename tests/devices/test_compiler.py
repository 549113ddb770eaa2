"""gpulab.devices.compiler: the compiler inductor would run, and the error that names the fix."""

from __future__ import annotations

import pytest

from gpulab.devices import compiler


def test_cxx_names_the_compiler(monkeypatch) -> None:
    monkeypatch.setenv("CXX", "my-c++")
    assert compiler.cxx_compiler_name() == "my-c++"
    monkeypatch.delenv("CXX")
    assert compiler.cxx_compiler_name() in ("g++", "clang++")


def test_a_missing_compiler_names_the_fix(monkeypatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert compiler.find_cxx_compiler() is None
    with pytest.raises(compiler.MissingCompilerError, match="`no-such-compiler-here` is not on PATH: install g\\+\\+"):
        compiler.require_cxx_compiler()
    assert "xcode-select" in compiler.missing_compiler_fix("darwin")


def test_this_machine_has_one(monkeypatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    if compiler.find_cxx_compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    assert compiler.require_cxx_compiler().endswith(compiler.cxx_compiler_name())

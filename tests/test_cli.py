"""gpulab.cli (``python -m gpulab``): each command reaches its module's entry point with the rest of
the arguments; help, unknown commands and a command whose module cannot be imported get clear
messages and exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys

from gpulab import cli


def test_doctor_json_through_the_command_line(capsys) -> None:
    assert cli.main(["doctor", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"mode", "facts", "problems", "notes", "labs"}


def test_every_command_is_dispatched_with_the_rest_of_the_arguments(monkeypatch) -> None:
    seen = []
    fake = type(sys)("fake_entry")
    fake.run = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "fake_entry", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_entry", "run", "a test command"))
    assert cli.main(["fake", "--flag", "x"]) == 3 and seen == [["--flag", "x"]]
    for name, (module, func, _) in cli.COMMANDS.items():
        if name != "fake":
            assert callable(getattr(__import__(module, fromlist=[func]), func)), name


def test_help_unknown_and_broken_commands(capsys, monkeypatch) -> None:
    assert cli.main([]) == 0 and cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m gpulab" in out and all(name in out for name in cli.COMMANDS)
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    monkeypatch.setitem(cli.COMMANDS, "broken", ("gpulab.no_such_module", "main", "broken"))
    assert cli.main(["broken"]) == 2
    assert "make setup" in capsys.readouterr().err


def test_python_dash_m_gpulab_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpulab", "help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "commands:" in proc.stdout, proc.stderr

"""manage.py runs the engine's processes on the C allocator (docs/DESIGN.md "Memory after a burst")."""

from __future__ import annotations

import sys

from manage import engine_allocator_argv


def test_an_engine_command_runs_again_with_the_interpreters_own_options_kept():
    again = engine_allocator_argv(["manage.py", "relay"], ["python", "-X", "dev", "manage.py", "relay"], {})
    assert again == [sys.executable, "-X", "dev", "manage.py", "relay"]
    assert engine_allocator_argv(["manage.py", "materialize", "--name", "m"], ["py", "manage.py"], {}) is not None


def test_other_commands_and_an_allocator_the_operator_chose_are_left_as_they_are():
    assert engine_allocator_argv(["manage.py", "migrate"], ["python", "manage.py", "migrate"], {}) is None
    assert engine_allocator_argv(["manage.py"], ["python", "manage.py"], {}) is None
    chosen = {"PYTHONMALLOC": "pymalloc"}
    assert engine_allocator_argv(["manage.py", "relay"], ["python", "manage.py", "relay"], chosen) is None

"""manage.py runs the engine's processes on the C allocator (docs/DESIGN.md "Memory after a burst")."""

from __future__ import annotations

import sys

from manage import engine_allocator_argv, engine_environ


def test_an_engine_command_runs_again_with_the_interpreters_own_options_kept():
    again = engine_allocator_argv(["manage.py", "relay"], ["python", "-X", "dev", "manage.py", "relay"], {})
    assert again == [sys.executable, "-X", "dev", "manage.py", "relay"]
    assert engine_allocator_argv(["manage.py", "materialize", "--name", "m"], ["py", "manage.py"], {}) is not None


def test_other_commands_and_an_allocator_the_operator_chose_are_left_as_they_are():
    assert engine_allocator_argv(["manage.py", "migrate"], ["python", "manage.py", "migrate"], {}) is None
    assert engine_allocator_argv(["manage.py"], ["python", "manage.py"], {}) is None
    chosen = {"PYTHONMALLOC": "pymalloc"}
    assert engine_allocator_argv(["manage.py", "relay"], ["python", "manage.py", "relay"], chosen) is None


def test_the_engine_runs_on_one_c_allocator_arena_unless_the_operator_set_one():
    assert engine_environ({"PATH": "/bin"}) == {"PATH": "/bin", "PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "1"}
    assert engine_environ({"MALLOC_ARENA_MAX": "4"})["MALLOC_ARENA_MAX"] == "4"

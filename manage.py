#!/usr/bin/env python
"""Django's command-line entry point."""

import os
import sys

# The engine's long-running processes run on the C allocator (PYTHONMALLOC=malloc), not Python's small-object arenas.
# An arena goes back to the system only once every object in it is freed, so after a burst's batches a few survivors
# per arena kept the materializer at +49 % of its memory for good even after malloc_trim; on the C allocator the trim
# gives nearly all of it back (+15 %) for ~20 % slower allocation (docs/DESIGN.md "Memory after a burst").
ENGINE_COMMANDS = frozenset({"materialize", "relay"})
# With it, one glibc arena (MALLOC_ARENA_MAX) rather than one per thread: the materializer's three writer threads each
# kept their own arena's fragments of a burst (84 -> 99 MB after 100,000 fires; 84 -> 93 MB with one arena, no slower).
ENGINE_ENVIRON = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "1"}


def engine_allocator_argv(argv: list[str], orig_argv: list[str], environ: dict[str, str]) -> list[str] | None:
    """The command line to run again with PYTHONMALLOC=malloc (the interpreter's own options kept), or None to go on
    as is: only an engine command, and never over an allocator the operator chose."""
    if len(argv) < 2 or argv[1] not in ENGINE_COMMANDS or "PYTHONMALLOC" in environ:
        return None
    return [sys.executable, *orig_argv[1:]]


def engine_environ(environ: dict[str, str]) -> dict[str, str]:
    """The environment to run an engine command again in: the allocator settings above, unless set already."""
    return {**ENGINE_ENVIRON, **environ}


def main() -> None:
    again = engine_allocator_argv(sys.argv, sys.orig_argv, dict(os.environ))
    if again is not None:
        os.execve(sys.executable, again, engine_environ(dict(os.environ)))  # same process id
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A bad setting is the operator's to fix: its message names the variable; a traceback adds nothing.
        sys.exit(f"Configuration error: {exc}")


if __name__ == "__main__":
    main()

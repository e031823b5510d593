"""The layers of docs/ARCHITECTURE.md ("Layers"), read from the code's own imports: a new import that runs the wrong
way fails here, before it tangles the house."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The data plane's operator tools (its console pages and tags, benchmarks, commands) sit above both planes.
DATA_PLANE_TOOLS = ("dispatch/admin/", "dispatch/templatetags/", "dispatch/bench/", "dispatch/management/")


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at any depth of the file (function-level imports count too)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_import_reader_sees_imports_at_any_depth(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import os\n\ndef f():\n    from schedules.models import Schedule\n")
    assert {"os", "schedules.models", "schedules.models.Schedule"} <= imported_modules(source)


@pytest.mark.parametrize("path", sources("core"), ids=relative)
def test_core_imports_neither_plane(path):
    wrong = {m for m in imported_modules(path) for p in ("schedules", "dispatch", "tenants") if in_package(m, p)}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}"


@pytest.mark.parametrize(
    "path", [p for p in sources("dispatch") if not relative(p).startswith(DATA_PLANE_TOOLS)], ids=relative
)
def test_the_data_plane_never_imports_the_control_plane_or_tenants(path):
    wrong = {m for m in imported_modules(path) for p in ("schedules", "tenants") if in_package(m, p)}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}: read the row by SQL (dispatch/sql/control_plane.py)"


@pytest.mark.parametrize("path", sources("schedules") + sources("tenants"), ids=relative)
def test_the_control_plane_enters_the_data_plane_by_its_door(path):
    allowed = ("dispatch.services", "dispatch.models")
    wrong = {
        m
        for m in imported_modules(path)
        if in_package(m, "dispatch") and m != "dispatch" and not any(in_package(m, door) for door in allowed)
    }
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}: ask dispatch/services.py"


@pytest.mark.parametrize("path", sources("tenants"), ids=relative)
def test_tenants_sit_below_the_control_plane(path):
    wrong = {m for m in imported_modules(path) if in_package(m, "schedules")}
    assert not wrong, f"{relative(path)} imports {sorted(wrong)}"

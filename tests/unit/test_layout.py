"""The packages' import rules (docs/design.md, "Packages and their direction"), read from the
source with `ast`: every import of every module counts, those inside functions and under
TYPE_CHECKING too, so a rule cannot be dodged by importing late.
"""
from __future__ import annotations

import ast
import graphlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGES = ("wire", "observe", "db", "operate", "runtime", "buyer_server", "seller_server", "client",
            "simulation")
# What each package may import of the others (itself always): the packages point one way.
ALLOWED = {
    "wire": set(),
    "observe": {"wire"},
    "db": {"wire.errors", "wire.values", "observe"},
    # the operator's tools (market admin, audit, backup, seed): over db/, imported by no server
    "operate": {"wire", "db", "observe", "runtime.config"},
}


def _project_root() -> Path:
    """The folder holding pyproject.toml, wherever under tests/ this file sits."""
    return next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").exists())


@dataclass(frozen=True)
class Import:
    """One imported thing: `target` a module, `name` what was taken from it ("" for `import m`)."""

    importer: str
    target: str
    name: str
    line: int

    def __str__(self) -> str:
        what = f"{self.target}.{self.name}" if self.name else self.target
        return f"{self.importer}:{self.line} imports {what}"


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a module file ('wire.framing', 'simulation' for its __init__)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str, root: Path) -> bool:
    """Whether a dotted name is a module or package of the project (not an attribute)."""
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, its dots resolved against the importer."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import in a module file, `from m import sub` naming the submodule as the target."""
    importer, found = module_name(path, root), []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(importer, alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = absolute(importer, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.append(Import(importer, sub, "", node.lineno) if is_module(sub, root)
                             else Import(importer, source, alias.name, node.lineno))
    return found


@cache
def project_imports() -> tuple[Import, ...]:
    """The imports of every module of the project's packages that name one of those packages."""
    root = _project_root()
    found: list[Import] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found += [i for i in imports_of(path, root) if i.target.split(".")[0] in PACKAGES]
    return tuple(found)


def package_of(module: str) -> str:
    return module.split(".")[0]


def outside_allowed(imports: tuple[Import, ...], package: str, allowed: set[str]) -> list[str]:
    """The imports of `package`'s modules that reach past what it may import."""
    def permitted(target: str) -> bool:
        return package_of(target) == package or any(
            target == ok or target.startswith(f"{ok}.") for ok in allowed)
    return [str(i) for i in imports if package_of(i.importer) == package and not permitted(i.target)]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, root: Path) -> list[str]:
    """Private names (`_name`) a module takes from another: imported, or read off an imported module."""
    found = [str(i) for i in imports_of(path, root)
             if package_of(i.target) in PACKAGES and is_private(i.name)]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = {bound for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
               for bound, target in bindings(node, path, root) if is_module(target, root)}
    found += [f"{module_name(path, root)}:{node.lineno} reads {node.value.id}.{node.attr}"
              for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id in modules and is_private(node.attr)]
    return found


def bindings(node: ast.Import | ast.ImportFrom, path: Path, root: Path) -> list[tuple[str, str]]:
    """The names an import binds, each with the dotted name it is bound to (`import a.b`: a, a)."""
    if isinstance(node, ast.Import):
        return [(alias.asname, alias.name) if alias.asname else (alias.name.split(".")[0],) * 2
                for alias in node.names]
    source = absolute(module_name(path, root), path.name == "__init__.py", node)
    return [(alias.asname or alias.name, f"{source}.{alias.name}") for alias in node.names]


def cycle(edges: list[tuple[str, str]]) -> list[str]:
    """One cycle among the edges' nodes ([] when they point one way)."""
    graph: dict[str, set[str]] = {}
    for importer, target in edges:
        graph.setdefault(importer, set()).add(target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_lower_package_imports_only_what_it_may(package: str) -> None:
    assert outside_allowed(project_imports(), package, ALLOWED[package]) == []


def test_the_packages_point_one_way() -> None:
    edges = [(package_of(i.importer), package_of(i.target)) for i in project_imports()
             if package_of(i.importer) != package_of(i.target)]
    assert cycle(edges) == []


def test_the_client_modules_point_one_way() -> None:
    edges = [(i.importer, i.target) for i in project_imports()
             if package_of(i.importer) == "client" and package_of(i.target) == "client"
             and i.importer != i.target and i.target != "client"]
    assert cycle(edges) == []


def test_no_module_takes_another_modules_private_names() -> None:
    root = _project_root()
    found = [use for package in PACKAGES for path in sorted((root / package).rglob("*.py"))
             for use in private_uses(path, root)]
    assert found == []


def test_no_module_imports_a_main_module() -> None:
    assert [str(i) for i in project_imports() if i.target.split(".")[-1] == "__main__"] == []


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The checks above find what they look for: a made-up tree breaking each rule."""
    for package in ("wire", "db", "client"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "wire" / "values.py").write_text("from db import shop\n")
    (tmp_path / "db" / "shop.py").write_text("from wire.values import _rule\nfrom wire import app\n")
    (tmp_path / "client" / "shell.py").write_text("from . import commands\n")
    (tmp_path / "client" / "commands.py").write_text("from client.shell import Shell\n")
    imports = tuple(i for path in sorted(tmp_path.rglob("*.py")) for i in imports_of(path, tmp_path))
    assert outside_allowed(imports, "wire", set()) == ["wire.values:1 imports db.shop"]
    assert outside_allowed(imports, "db", ALLOWED["db"]) == ["db.shop:2 imports wire.app"]
    assert set(cycle([(i.importer, i.target) for i in imports if i.importer.startswith("client")])) \
        == {"client.commands", "client.shell"}
    assert private_uses(tmp_path / "db" / "shop.py", tmp_path) == ["db.shop:1 imports wire.values._rule"]


def test_no_server_imports_the_operators_tools() -> None:
    servers = ("wire", "db", "observe", "runtime", "buyer_server", "seller_server")
    assert [str(i) for i in project_imports()
            if package_of(i.importer) in servers and package_of(i.target) == "operate"] == []

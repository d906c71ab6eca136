"""The wheel carries the rule pack and probe definitions, and installed code finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_wheel_ships_rules_runbooks_and_probes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("diagnoser-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_rules = {
        p.relative_to(REPO / "rules").as_posix() for p in (REPO / "rules").rglob("*") if p.is_file()
    }
    assert {f"diagnoser/_data/rules/{name}" for name in shipped_rules} <= names
    assert "diagnoser/_data/rules/pools/pool-exhaustion.md" in names
    assert any(n.startswith("diagnoser/_data/probes/") for n in names)
    assert "diagnoser/_data/signals/pools.yaml" in names  # the signal catalogue ships too
    assert "diagnoser/py.typed" in names

    # Installed from the wheel, the loader finds the packaged pack (not a source checkout).
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "from diagnoser.ruleset import builtin_rules_dir, load_rules;"
        "d = builtin_rules_dir(); r = load_rules([]);"
        "print(d); print(len(r), len(r.problems))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    location, counts = result.stdout.split("\n")[:2]
    assert location.startswith(str(site))
    rules, problems = map(int, counts.split())
    assert rules >= 20
    assert problems == 0


def test_public_surface_is_exported() -> None:
    import diagnoser

    for name in diagnoser.__all__:
        assert hasattr(diagnoser, name), name
    assert diagnoser.pool_size_for(5000, 0.004, 1.25) == 25


def test_importing_the_models_loads_no_client_library() -> None:
    # The package __init__ is lazy: a tool reading diagnoser's JSON needs the models, not the clients.
    code = (
        "import sys, diagnoser.models;"
        "heavy = {'prometheus_api_client', 'kubernetes', 'elasticsearch', 'httpx', 'aiohttp', 'slack_sdk'};"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_every_exception_diagnoser_defines_is_in_the_one_tree() -> None:
    import ast

    def derives_from_a_builtin_exception(node: ast.ClassDef) -> bool:
        # A private one (``_QueryFailure``) is control flow inside its module, and a subclass of a
        # client library's exception (``httpx.RemoteProtocolError``) belongs to that library's
        # protocol: neither leaves its module. Every other one is in the tree.
        return not node.name.startswith("_") and any(
            isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception")) for b in node.bases
        )

    outside = []
    for path in (REPO / "diagnoser").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and derives_from_a_builtin_exception(node)
                and path.name != "errors.py"
            ):
                outside.append(f"{path.relative_to(REPO)}: {node.name}")
    assert outside == []
    from diagnoser import errors

    for name in errors.__all__:
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.DiagnoserError), name
            assert name in (errors.__doc__ or ""), f"{name} is not in the documented tree"


#: diagnoser's packages, lowest first: each may import only those before it (ARCHITECTURE.md).
LAYERS = [
    "redact", "errors", "yamlfile", "numbers", "stable_labels", "promql", "models", "config", "probe", "sources", "signals", "checks", "ruleset",
    "engine", "notify", "capacity", "daemon", "testing", "cli",
]  # fmt: skip


def test_no_package_imports_one_above_it() -> None:
    import ast

    upward = []
    for path in (REPO / "diagnoser").rglob("*.py"):
        own = path.relative_to(REPO / "diagnoser").parts[0].removesuffix(".py")
        if own not in LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diagnoser."):
                other = node.module.split(".")[1]
                if other in LAYERS and LAYERS.index(other) > LAYERS.index(own):
                    upward.append(f"{path.relative_to(REPO)} imports {node.module}")
    assert upward == []
    packaged = {p.name.removesuffix(".py") for p in (REPO / "diagnoser").iterdir() if not p.name.startswith("_")}
    assert packaged - {"py.typed"} <= set(LAYERS), "a new package needs its place in LAYERS and ARCHITECTURE.md"

"""How far the whole ``Settings`` reaches: the functions that take it, below the CLI and above.

Reads the package's source with :mod:`ast` (nothing is imported) and prints three figures:
functions and methods with a parameter annotated with ``Settings`` (alone or in a union), those
of them below the CLI and the daemon's assembly (``cli/``, ``daemon/service.py``), and the
``from_settings`` / ``of`` constructors of small config objects (counted apart: they are where
the settings are taken apart once). ``--list`` names each.

Usage: ``python bench/settings_reach.py [DIR] [--list]`` (default DIR: ``diagnoser``); run it on
an older checkout's ``diagnoser/`` to compare.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

_WHOLE = re.compile(r"(?<![A-Za-z])Settings\b")
_ASSEMBLY = ("/cli/", "daemon/service.py")
_CONSTRUCTORS = ("from_settings", "of")


def settings_takers(root: Path) -> tuple[list[str], list[str]]:
    """``(functions, constructors)`` taking the whole settings, as ``path:line:name``."""
    functions: list[str] = []
    constructors: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(p.annotation is not None and _WHOLE.search(ast.unparse(p.annotation)) for p in params):
                where = f"{path}:{node.lineno}:{node.name}"
                (constructors if node.name in _CONSTRUCTORS else functions).append(where)
    return functions, constructors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default="diagnoser", type=Path)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    functions, constructors = settings_takers(args.root)
    below = [f for f in functions if not any(part in f for part in _ASSEMBLY)]
    print(f"functions taking the whole Settings: {len(functions)}")
    print(f"  of them below the CLI and the daemon's assembly: {len(below)}")
    print(f"from_settings constructors of small config objects: {len(constructors)}")
    if args.list:
        print("\n".join(functions))


if __name__ == "__main__":
    main()

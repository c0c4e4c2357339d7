"""The Learner's parts keep to their own state (beside tests/test_layers.py, which checks the layers).

``Learner`` is assembled from mixins in ``lightning_rl/learner/`` (``update_api``,
``optimizers``, ``multi_module``, ``state``, ``lightning_hooks``) and helper modules
(``sharding``, ``step_runner``, ...). Each private name (``_x``) belongs to the file that
defines it: the file with its ``def``/``class``, or the file whose ``__init__`` assigns it.
A part that touches a private name another part owns couples the two files through
something neither documents; these tests keep such touches few, and name them when they grow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

LEARNER = Path(__file__).resolve().parents[1] / "lightning_rl" / "learner"
# The most private names one part may touch in another part (issue 28: 42 before the StepRunner).
MOST_FOREIGN_PRIVATE_NAMES = 6


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _parts() -> dict[str, ast.Module]:
    """Every module of ``lightning_rl/learner/`` (the LearnerGroup's package is a user of the Learner, not a part)."""
    return {path.name: ast.parse(path.read_text()) for path in sorted(LEARNER.glob("*.py"))}


def _owned_names(tree: ast.Module) -> set[str]:
    """The private names a file defines: its functions, classes and module names, and what its ``__init__``\\ s assign."""
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _is_private(node.name):
            owned.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init__":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) and _is_private(inner.attr):
                    owned.add(inner.attr)
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        owned.update(t.id for t in targets if isinstance(t, ast.Name) and _is_private(t.id))
    return owned


def foreign_private_names() -> list[tuple[str, str, str]]:
    """``(file, name, owner)`` for each private name a part touches (reads or assigns) that another part owns."""
    parts = _parts()
    owners: dict[str, set[str]] = defaultdict(set)
    for file, tree in parts.items():
        for name in _owned_names(tree):
            owners[name].add(file)
    found = set()
    for file, tree in parts.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                others = owners.get(node.attr, set())
                if others and file not in others:
                    found.add((file, node.attr, ", ".join(sorted(others))))
    return sorted(found)


def test_the_learners_parts_touch_few_private_names_of_other_parts():
    found = foreign_private_names()
    listed = "\n".join(f"  {file} uses {name} of {owner}" for file, name, owner in found)
    assert len(found) <= MOST_FOREIGN_PRIVATE_NAMES, f"{len(found)} private names used across parts:\n{listed}"


def test_the_count_sees_a_part_reaching_into_another():
    # The check must be able to fail: a part reading the Learner's private module is seen.
    tree = ast.parse("class Mixin:\n    def f(self):\n        return self._module\n")
    owner = ast.parse("class Learner:\n    def __init__(self):\n        self._module = None\n")
    assert "_module" in _owned_names(owner)
    reads = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _is_private(n.attr)]
    assert reads == ["_module"] and "_module" not in _owned_names(tree)


def test_no_part_imports_the_learner_back():
    """``learner.py`` imports its parts; a part importing ``learner.py`` (even for annotations) closes a circle."""
    offenders = []
    for file, tree in _parts().items():
        if file in ("learner.py", "__init__.py"):  # the Learner itself, and the package exporting it
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "lightning_rl.learner.learner":
                offenders.append(f"{file}:{node.lineno}")
    assert not offenders, f"parts importing lightning_rl.learner.learner: {offenders}"

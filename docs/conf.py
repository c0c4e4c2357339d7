"""Sphinx configuration of the lightning_rl documentation site.

Build it (warnings are errors, as in CI and ``tests/test_docs.py``)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Pages are MyST Markdown; the API reference is generated from the docstrings at build time
(autosummary writes one page per public module into ``docs/api/_autosummary``, which is not
committed); the CLI reference prints the real ``--help`` of each subcommand at build time.
The build never touches the network.

Writing pages (MyST Markdown):

- Link a page by its path, a heading by its anchor: ``[Train](tutorials/train.md)``,
  ``[fit](cli.md#fit)`` (headings down to ``###`` have anchors: the heading's text,
  lower-cased, spaces as ``-``). A link to a missing page or anchor fails the build.
- Name package objects by their public path or where they are defined; both resolve:
  ``{py:class}`lightning_rl.Learner```, ``{py:meth}`~lightning_rl.Learner.update```,
  ``{py:class}`lightning_rl.data.OnPolicyDataModule```, ``{py:mod}`lightning_rl.core.columns```.
  A reference to a ``lightning_rl`` name the site does not describe fails the build.
- Every ```` ```python ```` block runs in tests/test_docs.py, in order, one namespace per page.
  A block that cannot run in CI (GPU, cluster) is marked by the line ``% skip-test`` (a MyST
  comment) right above its fence.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import os
import pkgutil
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the checkout's lightning_rl, whatever is installed

project = "lightning_rl"
author = "the lightning_rl authors"
copyright = "the lightning_rl authors"  # noqa: A001 (Sphinx's name)
release = version = importlib.import_module("lightning_rl").__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    # The source of every documented module, as pages of the site ("[source]" links). The
    # issue asked for linkcode, which links to a hosted repository; the project has no public
    # URL to point at, so the source is rendered into the site instead.
    "sphinx.ext.viewcode",
]
# No intersphinx: CI has no network beyond package registries, so the inventories of Python,
# torch, Lightning and gymnasium could not be fetched (nor shipped: we cannot download them),
# and the build must never touch the network. References to those libraries stay plain text.

# .rst first: autosummary writes its generated pages with the first suffix, and they are RST.
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]
nitpicky = False  # type hints name torch, Lightning and gymnasium classes with no inventory here

# --- MyST ------------------------------------------------------------------------------------
# Headings up to ### get anchors, so ``[text](page.md#a-heading)`` links resolve, and a link
# to a missing page or anchor is a warning (an error under -W): links inside the site are checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# --- API reference ---------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False  # a re-exported name links to its defining module's page
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
    # Document what a module defines, never what it imports: a package's __all__ re-exports
    # would otherwise describe each object twice (and -W fails on duplicates). The package
    # pages list their re-exports as links instead (the lightning-rl-exports directive below).
    "ignore-module-all": True,
}
autodoc_member_order = "bysource"
# Every module has ``from __future__ import annotations``: hints are strings, some naming
# classes imported only under TYPE_CHECKING. Printed in the parameter descriptions, as written.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_type_aliases: dict[str, str] = {}
# Google style (Args:, Returns:, Raises:), as every docstring in the package is written.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections as fields of their class, not attribute entries: NamedTuple and
# dataclass fields are also documented as members, and two entries would be duplicates.
napoleon_use_ivar = True
add_module_names = False
python_use_unqualified_type_names = True

# --- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"lightning_rl {release}"
html_static_path: list[str] = []


# --- Local extensions ------------------------------------------------------------------------
PACKAGE = "lightning_rl"
_ASSIGNED: dict[str, set[str]] = {}


def _assigned_names(module: Any) -> set[str]:
    """The names a module assigns at its top level (constants, type aliases), read from its source."""
    if module.__name__ not in _ASSIGNED:
        names: set[str] = set()
        with contextlib.suppress(OSError, TypeError, SyntaxError):
            for node in ast.parse(inspect.getsource(module)).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        _ASSIGNED[module.__name__] = names
    return _ASSIGNED[module.__name__]


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def _public_modules() -> list[str]:
    """Every public module of the package (no part of its name starts with an underscore)."""
    package = importlib.import_module(PACKAGE)
    names = [PACKAGE] + [m.name for m in pkgutil.walk_packages(package.__path__, PACKAGE + ".")]
    return [name for name in names if not _is_private(name)]


_HOMES: dict[str, str] = {}


def _public_homes() -> dict[str, str]:
    """Objects defined in a private module (``learner.group._protocol``) and listed in the
    ``__all__`` of public ones: their private dotted name -> the public module that documents
    them (the most specific one that lists them)."""
    if not _HOMES:
        for module_name in _public_modules():
            module = importlib.import_module(module_name)
            for name in getattr(module, "__all__", ()):
                defined = _defined_at(f"{module_name}.{name}")
                if defined is not None and _is_private(defined):
                    home = _HOMES.get(defined, "")
                    if len(module_name) > len(home):
                        _HOMES[defined] = module_name
        _HOMES.setdefault("", "")  # computed, even when there are none
    return _HOMES


def _defined_at(dotted: str) -> str | None:
    """The dotted path of the module and qualified name that define ``dotted``'s object, or
    ``None`` when ``dotted`` is not an object of this package."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    for split in range(len(parts), 0, -1):
        try:
            obj = module = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        break
    else:
        return None
    parent = None
    try:
        for attr in parts[split:]:
            parent, obj = obj, getattr(obj, attr)
    except AttributeError:
        return None
    if inspect.ismodule(obj):
        return obj.__name__
    if isinstance(obj, type) or inspect.isroutine(obj):
        qualname = getattr(obj, "__qualname__", None)
        owner = getattr(obj, "__module__", None)
        return f"{owner}.{qualname}" if owner and qualname and "<" not in qualname else None
    name = parts[-1]
    if isinstance(parent, type):  # a class attribute or property: where a class defines it
        for cls in parent.__mro__:
            if name in vars(cls):
                return f"{cls.__module__}.{cls.__qualname__}.{name}"
        return None
    if split != len(parts) - 1:
        return None
    if name in _assigned_names(module):
        return dotted
    # A constant re-exported by a package: the module of the package that assigns it.
    for candidate in sorted(m for m in list(sys.modules) if m.startswith(PACKAGE + ".")):
        other = sys.modules[candidate]
        if other is not None and vars(other).get(name) is obj and name in _assigned_names(other):
            return f"{candidate}.{name}"
    return None


def canonical_name(dotted: str) -> str | None:
    """Where the API reference describes ``dotted`` (``lightning_rl.Learner``,
    ``lightning_rl.data.ReplayBuffer``): the module that defines the object, or for an object
    of a private module, the public module that re-exports it. ``None`` for anything else."""
    defined = _defined_at(dotted)
    if defined is None or not _is_private(defined):
        return defined
    home = _public_homes().get(defined)
    return f"{home}.{defined.rsplit('.', 1)[1]}" if home else None


class ExportsDirective(SphinxDirective):
    """``.. lightning-rl-exports:: MODULE``: a table of the names in ``MODULE.__all__`` that it
    imports from other modules, each linked to where it is defined (and described once)."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        rows, documented_here = [], []
        current = self.env.ref_context.get("py:module")
        for name in getattr(module, "__all__", ()):
            target = canonical_name(f"{module_name}.{name}")
            if target is None:
                raise self.error(f"{module_name}.__all__ names {name!r}, which the API reference cannot document")
            if target.rsplit(".", 1)[0] != module_name:
                # Relative to the page's module where it can be (autosummary asks for that).
                if current and target.startswith(current + "."):
                    target = target[len(current) + 1 :]
                rows.append(f"   ~{target}")
            elif _is_private(_defined_at(target) or ""):
                documented_here.append((name, getattr(module, name)))
        lines = []
        if rows:
            lines += [".. rubric:: Public names defined in other modules", "", ".. autosummary::", "   :nosignatures:", ""]
            lines += [*rows, ""]
        for name, obj in documented_here:  # defined in a private module, described here
            kind = "exception" if isinstance(obj, type) and issubclass(obj, BaseException) else (
                "class" if isinstance(obj, type) else "function" if inspect.isroutine(obj) else "data"
            )
            lines += [f".. auto{kind}:: {module_name}.{name}", ""]
        if not lines:
            return []
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, container)
        return container.children


class HelpDirective(SphinxDirective):
    """``.. lightning-rl-help:: [SUBCOMMAND]``: the text ``lightning-rl [SUBCOMMAND] --help`` prints,
    run at build time in this process (100 columns wide), as a literal block."""

    optional_arguments = 1
    option_spec = {"caption": directives.unchanged}
    width = "100"

    def run(self) -> list[nodes.Node]:
        from lightning_rl.cli import main

        args = [*self.arguments, "--help"]
        printed = io.StringIO()
        previous = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = self.width
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Lightning's notes on running its CLI in-process
                main(args)
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise self.error(f"'lightning-rl {' '.join(args)}' exited with status {exit_.code}") from None
        finally:
            if previous is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = previous
        text = printed.getvalue().rstrip()
        if not text:
            raise self.error(f"'lightning-rl {' '.join(args)}' printed nothing")
        block = nodes.literal_block(text, text, language="text")
        return [block]


def _resolve_reexport(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A Python cross-reference into the package resolves where the object is described:
    ``lightning_rl.Learner`` (a re-export) to ``lightning_rl.learner.learner.Learner``.

    One to a public name that resolves nowhere is a warning (an error under -W), so a page or docstring that
    names a package object that does not exist, or is not documented, fails the build.
    References to other libraries (no inventories here) stay plain text, as nitpicky=False says.
    """
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if target.split(".", 1)[0] != PACKAGE or _is_private(target):
        return None  # private bases ("Bases: _FixedOpponent") are left plain, as private pages are
    canonical = canonical_name(target)
    domain = env.get_domain("py")
    if canonical is not None and canonical != target:
        resolved = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode)
        if resolved is not None:
            return resolved
    logger.warning(
        "reference to %s, which the site does not describe%s",
        target,
        f" (defined at {canonical})" if canonical and canonical != target else "",
        location=node,
        type="lightning_rl",
        subtype="reference",
    )
    return None


def _follow_imported(app: Any, modname: str, attribute: str) -> str:
    """The module whose source ``[source]`` links show: where the object is defined, if that is
    this package; otherwise the module that documents it. (A value defined outside the
    package, such as a class attribute holding ``float`` or a ``dict[...]`` alias, would make
    viewcode list a module, ``builtins``, in its index that has no page: a link to nowhere.)"""
    from sphinx.ext.viewcode import _get_full_modname

    defined = _get_full_modname(modname, attribute)
    return defined if defined and defined.split(".", 1)[0] == PACKAGE else modname


# --- Navigation ------------------------------------------------------------------------------
# Furo draws its navigation sidebar on every page from ``toctree(titles_only=True, maxdepth=-1)``.
# Sphinx answers that by copying each document's whole contents tree (every section, and on the
# API pages every class, method and attribute entry) for every page, and only then cuts the
# copies down to the documents' titles, on each of ~320 pages. The sidebar below is built from
# the tables of contents cut to their titles once, before any copy: the same HTML (the site
# built both ways, every file compared), in 146 s instead of 183 s on an idle 2-core machine.
# tests/test_docs.py checks every page's sidebar. Each page's own "On this page" contents are
# not built from these and keep every entry.
_TITLE_TOCS: dict[str, nodes.bullet_list] = {}


def _cut_tocs_to_titles(app: Any, env: Any) -> None:
    """After reading: each document's contents tree as ``titles_only`` leaves it (its title and
    the toctrees under it). Documents whose tree Sphinx would cut differently (``only`` nodes,
    a ``tocdepth``) keep their full tree."""
    _TITLE_TOCS.clear()
    for docname, toc in env.tocs.items():
        if env.metadata[docname].get("tocdepth", 0) or next(toc.findall(addnodes.only), None):
            _TITLE_TOCS[docname] = toc
            continue
        cut = toc.deepcopy()
        for top_level in cut.children:  # what Sphinx's titles_only does to each copy
            if len(top_level) > 1:
                if subtrees := list(top_level.findall(addnodes.toctree)):
                    top_level[1][:] = subtrees
                else:
                    top_level.pop(1)
        _TITLE_TOCS[docname] = cut


def _navigation_from_titles(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Before Furo reads the page's context: its ``toctree(titles_only=True)`` reads the cut trees."""
    toctree = context.get("toctree")
    if toctree is None or not _TITLE_TOCS:
        return

    def navigation(**options: Any) -> str:
        if not options.get("titles_only"):
            return toctree(**options)
        full = app.env.tocs
        app.env.tocs = _TITLE_TOCS
        try:
            return toctree(**options)
        finally:
            app.env.tocs = full

    context["toctree"] = navigation


def _clear_generated(app: Any) -> None:
    """Start from no generated API pages: a module that was renamed or removed leaves none behind."""
    shutil.rmtree(Path(app.srcdir) / "api" / "_autosummary", ignore_errors=True)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _clear_generated, priority=100)  # before autosummary generates
    app.connect("missing-reference", _resolve_reexport)
    app.connect("viewcode-follow-imported", _follow_imported)
    app.connect("env-updated", _cut_tocs_to_titles)
    app.connect("html-page-context", _navigation_from_titles, priority=400)  # Furo's runs at 500
    app.add_directive("lightning-rl-exports", ExportsDirective)
    app.add_directive("lightning-rl-help", HelpDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

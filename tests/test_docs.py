"""The documentation site (docs/): it builds with no warnings, its links resolve, its Python runs.

- The site builds as CI builds it, ``python -m sphinx -W --keep-going``: any warning fails,
  among them a broken link or anchor between pages (MyST warns on those), a page in no toctree,
  a toctree entry with no page, docstring markup the API reference cannot parse, and a
  reference to a ``lightning_rl`` object the site does not describe (docs/conf.py). Built once
  per session into a temporary folder, from a copy of docs/ (the checkout is left as it is).
- Every link inside the built site reaches a page that exists, at an anchor that exists.
- Every ```` ```python ```` block of every page runs: page by page, blocks in order sharing one
  namespace per page, in a temporary working directory (as tests/test_readme.py runs the
  README's). A block that needs what CI does not have (a GPU, several machines) opts out with
  the MyST comment line ``% skip-test`` right above its fence; nothing else skips.
- The CLI reference (docs/cli.md) prints the help of every subcommand the command has.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from lightning_rl.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_MARKER = "% skip-test"
# Not pages: the build's output, and the API pages autosummary generates into the source tree.
_NOT_PAGES = ("_build", "api/_autosummary")

if sys.version_info < (3, 11):  # the docs extra's Sphinx 9 needs 3.11 (pyproject.toml)
    pytest.skip("the docs build is checked on Python >= 3.11", allow_module_level=True)


def _pages() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [page for page in pages if not any(page.relative_to(DOCS).as_posix().startswith(p) for p in _NOT_PAGES)]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """The ```` ```python ```` blocks of a MyST page that run: (line of the first code line, code).

    A block right below a ``% skip-test`` line (blank lines between are allowed) is left out.
    """
    lines = page.read_text().splitlines()
    blocks: list[tuple[int, str]] = []
    index = 0
    while index < len(lines):
        opening = re.fullmatch(r"(\s*)(`{3,}|~{3,})\s*python\s*", lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening.group(2)
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page}:{index + 1}: a ```python block that never closes")
        above = index - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        if above < 0 or lines[above].strip() != SKIP_MARKER:
            indent = len(opening.group(1))
            blocks.append((index + 2, "\n".join(line[indent:] for line in lines[index + 1 : end])))
        index = end + 1
    return blocks


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """The site, built once with warnings as errors from a copy of docs/.

    Beside the copy, links to the rest of the checkout, so that pages reach files outside docs/
    by the same relative paths (``../benchmarks/results/...png``).
    """
    work = tmp_path_factory.mktemp("docs")
    source = work / "docs"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build", "_autosummary"))
    for entry in ROOT.iterdir():
        if entry.name not in ("docs", ".git"):
            (work / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    output = work / "html"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(work / "doctrees"), str(source), str(output)]
    start = time.perf_counter()
    build = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    return output, build, time.perf_counter() - start


def test_site_builds_with_no_warnings(built_site):
    output, build, seconds = built_site
    assert build.returncode == 0, (
        f"python -m sphinx -W failed (status {build.returncode}, {seconds:.0f} s):\n{build.stderr}{build.stdout}"
    )
    for page in _pages():
        built = output / page.relative_to(DOCS).with_suffix(".html")
        assert built.is_file(), f"{page.relative_to(ROOT)} was not built (excluded?)"


class _Links:
    """The ids a page defines and the links (``<a href>``) it holds.

    Read with two regular expressions rather than ``html.parser`` (8x slower on this site's
    25 MB): Sphinx and Furo write every attribute value in double quotes, with ``"`` and ``&``
    escaped inside it, so a start tag's ``id="..."`` and ``href="..."`` are found exactly. On
    every page of the site both readings gave the same ids and links.
    """

    _START_TAG = re.compile(r"<([a-zA-Z][a-zA-Z0-9]*)(\s[^>]*)?>")
    _ID_OR_HREF = re.compile(r'\s(id|href)="([^"]*)"')

    def __init__(self, text: str) -> None:
        self.ids: set[str] = set()
        self.links: list[str] = []
        for tag in self._START_TAG.finditer(text):
            for name, value in self._ID_OR_HREF.findall(tag.group(2) or ""):
                value = html.unescape(value)
                if name == "id" and value:
                    self.ids.add(value)
                elif name == "href" and value and tag.group(1).lower() == "a":
                    self.links.append(value)


def test_links_inside_the_site_resolve(built_site):
    output, build, _ = built_site
    if build.returncode != 0:
        pytest.skip("the build failed (test_site_builds_with_no_warnings says why)")
    parsed: dict[str, _Links] = {}

    def page(path: str) -> _Links:
        if path not in parsed:
            parsed[path] = _Links(Path(path).read_text(encoding="utf-8"))
        return parsed[path]

    # Paths as strings, joined and normalized without touching the disk (the output has no
    # symlinks): ~65k links, where Path.resolve() per link took longer than reading the pages.
    files = {os.fspath(path) for path in output.rglob("*") if path.is_file()}
    broken = []
    pages = sorted(os.fspath(path) for path in output.rglob("*.html"))
    assert pages
    for source in pages:
        folder = os.path.dirname(source)
        for link in page(source).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue  # outside the site: CI has no network to check it
            target = os.path.normpath(os.path.join(folder, unquote(parts.path))) if parts.path else source
            if target not in files and os.path.join(target, "index.html") in files:
                target = os.path.join(target, "index.html")  # a folder's link
            where = f"{os.path.relpath(source, output)}: {link}"
            if target not in files:
                broken.append(f"{where} (no such file)")
            elif parts.fragment and target.endswith(".html") and unquote(parts.fragment) not in page(target).ids:
                broken.append(f"{where} (no such anchor)")
    assert not broken, "links inside the site that lead nowhere:\n" + "\n".join(broken)


def test_every_pages_navigation_links_every_document_by_its_title_and_marks_the_page(built_site):
    """Furo's sidebar, which conf.py builds from tables of contents cut to their titles: on every
    page, one link to each document (no section anchors), and the page itself marked current."""
    output, build, _ = built_site
    if build.returncode != 0:
        pytest.skip("the build failed (test_site_builds_with_no_warnings says why)")
    generated = {"genindex.html", "search.html", "py-modindex.html"}
    pages = sorted(os.path.relpath(path, output) for path in output.rglob("*.html"))
    documents = {page for page in pages if not page.startswith("_modules") and page not in generated}
    for page in pages:
        text = (output / page).read_text(encoding="utf-8")
        start = text.index('class="sidebar-tree"')
        navigation = text[start : text.index("</div>", start)]
        links = _Links(navigation).links
        here = [link for link in links if link == "#"]
        linked = {os.path.normpath(os.path.join(os.path.dirname(page), link)) for link in links if link != "#"}
        expected = documents - {"index.html"}  # the root page is the sidebar's brand link, not an entry
        if page in expected:
            assert len(here) == 1 and navigation.count("current-page") == 1, f"{page}: not marked current"
            expected = expected - {page}
        else:
            assert not here, f"{page}: a navigation entry points at the page itself"
        missing, extra = sorted(expected - linked)[:5], sorted(linked - expected)[:5]
        assert linked == expected, f"{page}: missing {missing}, extra {extra}"


@pytest.mark.parametrize(
    "page", [page for page in _pages() if python_blocks(page)], ids=lambda page: page.relative_to(DOCS).as_posix()
)
def test_python_blocks_of_the_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Trainers write lightning_logs/ and checkpoints here
    namespace: dict = {"__name__": f"docs_page_{page.stem}"}
    for line, code in python_blocks(page):
        # Padded so that a traceback names the page's own line numbers.
        exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)


def test_skip_marker_is_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "\n".join(["# T", "", "```python", "ran = 1", "```", "", "% skip-test", "", "```python", "gpu()", "```", ""])
    )
    assert python_blocks(page) == [(4, "ran = 1")]


def test_references_to_public_names_resolve_where_objects_are_described():
    spec = importlib.util.spec_from_file_location("lightning_rl_docs_conf", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    expected = {
        "lightning_rl.Learner": "lightning_rl.learner.learner.Learner",
        "lightning_rl.Learner.update": "lightning_rl.learner.update_api.UpdateApiMixin.update",
        "lightning_rl.Columns.OBS": "lightning_rl.core.columns.Columns.OBS",
        "lightning_rl.DEFAULT_OPTIMIZER": "lightning_rl.learner.optimizers.DEFAULT_OPTIMIZER",
        "lightning_rl.data.ReplayBuffer": "lightning_rl.data.uniform_replay.ReplayBuffer",
        # Defined in a private module: described by the public module that re-exports it.
        "lightning_rl.LearnerGroupError": "lightning_rl.learner.group.learner_group.LearnerGroupError",
        "lightning_rl.core.columns": "lightning_rl.core.columns",
        "lightning_rl.NoSuchName": None,
        "torch.nn.Module": None,
    }
    assert {name: conf.canonical_name(name) for name in expected} == expected


def test_cli_reference_prints_every_subcommand():
    text = (DOCS / "cli.md").read_text()
    documented = re.findall(r"^```\{lightning-rl-help\}[ \t]*(\S*)[ \t]*$", text, flags=re.MULTILINE)
    missing = [name for name in SUBCOMMANDS if name not in documented]
    assert not missing, (
        f"docs/cli.md prints no help for {missing}: add, under a '## `NAME`' section, "
        + " ".join(f"```{{lightning-rl-help}} {name}\\n```" for name in missing)
    )
    unknown = [name for name in documented if name and name not in SUBCOMMANDS]
    assert not unknown, f"docs/cli.md prints the help of {unknown}, which are not subcommands: {list(SUBCOMMANDS)}"
    assert "" in documented, "docs/cli.md prints no top-level help (```{lightning-rl-help}``` with no argument)"
    for name in SUBCOMMANDS:
        assert re.search(rf"^## `{name}`$", text, flags=re.MULTILINE), f"docs/cli.md has no '## `{name}`' section"

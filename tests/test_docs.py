"""The integration guide in docs/ builds without warnings, and its code excerpts cannot drift.

Every excerpt is a ``literalinclude`` between ``LITERALINCLUDE START/END`` marker comments. Sphinx
warns when a marker is missing, and ``-W`` turns the warning into a failed build: the negative test
checks that this really happens, so a renamed or deleted marker cannot go unnoticed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKED_SOURCES = [ROOT / "openreg", ROOT / "torch_openreg", ROOT / "pyproject.toml", ROOT / "setup.py"]
MARKER = re.compile(r"(?:#|//)\s*LITERALINCLUDE (START|END): (.+?)\s*$")


def _sphinx(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _source_files() -> list[Path]:
    files = []
    for place in MARKED_SOURCES:
        if place.is_file():
            files.append(place)
        else:
            files.extend(p for p in place.rglob("*") if p.suffix in (".py", ".cpp", ".h"))
    return sorted(files)


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    result = _sphinx(DOCS, tmp_path / "html")
    assert result.returncode == 0, f"sphinx failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "html" / "index.html").is_file()
    toctree = re.search(r"```\{toctree\}\n(?::[^\n]*\n)*(.*?)```", (DOCS / "index.md").read_text(), re.S)
    listed = toctree.group(1).split()
    chapters = sorted(p.stem for p in DOCS.glob("*.md") if p.stem != "index")
    assert sorted(listed) == chapters, f"chapters not in the toctree: {set(chapters) - set(listed)}"
    for page in listed:
        assert (tmp_path / "html" / f"{page}.html").is_file(), f"{page} is not in the built guide"


def test_missing_marker_fails_the_build(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conf.py").write_text(
        'project = "marker-check"\nextensions = ["myst_parser"]\nexclude_patterns = ["_build"]\n'
    )
    (project / "code.py").write_text(
        "# LITERALINCLUDE START: PRESENT\nVALUE = 1\n# LITERALINCLUDE END: PRESENT\n"
    )
    page = (
        "# Page\n\n"
        "```{literalinclude} code.py\n"
        ":language: python\n"
        ":start-after: LITERALINCLUDE START: {name}\n"
        ":end-before: LITERALINCLUDE END: {name}\n"
        "```\n"
    )
    # The same project builds while the marker exists...
    (project / "index.md").write_text(page.replace("{name}", "PRESENT"))
    ok = _sphinx(project, tmp_path / "ok")
    assert ok.returncode == 0, f"control build failed:\n{ok.stdout}\n{ok.stderr}"
    # ...and fails once the page asks for a marker that is not in the source.
    (project / "index.md").write_text(page.replace("{name}", "ABSENT"))
    bad = _sphinx(project, tmp_path / "bad")
    assert bad.returncode != 0, "a literalinclude of a missing marker must fail the build"
    assert "pattern not found" in bad.stdout + bad.stderr


def test_markers_come_in_pairs() -> None:
    starts: Counter = Counter()
    ends: Counter = Counter()
    problems = []
    for path in _source_files():
        open_names: list[str] = []
        seen: set[str] = set()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = MARKER.search(line)
            if not match:
                continue
            kind, name = match.groups()
            where = f"{path.relative_to(ROOT)}:{number}"
            if kind == "START":
                if name in seen:
                    problems.append(f"{where}: START {name!r} twice in one file (an excerpt would be ambiguous)")
                seen.add(name)
                open_names.append(name)
                starts[name] += 1
            else:
                if name not in open_names:
                    problems.append(f"{where}: END {name!r} without a START before it in this file")
                else:
                    open_names.remove(name)
                ends[name] += 1
        problems.extend(f"{path.relative_to(ROOT)}: START {n!r} is never closed" for n in open_names)
    assert starts, "no markers found: the source layout changed?"
    assert set(starts) == set(ends), problems
    assert not problems, "\n".join(problems)


def test_every_excerpt_comes_from_a_marker() -> None:
    """Code is never pasted into a chapter: fences are literalincludes (or plain-text diagrams)."""
    fence = re.compile(r"^```(\S*)", re.MULTILINE)
    include = re.compile(r"```\{literalinclude\} (\S+)\n((?::[^\n]*\n)*)```")
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        for match in fence.finditer(text):
            kind = match.group(1)
            if kind:  # an opening fence (closing fences have no info string)
                assert kind in ("{literalinclude}", "{toctree}", "text"), f"{page.name}: a ```{kind} block"
        for match in include.finditer(text):
            target, options = match.groups()
            assert (page.parent / target).resolve().is_file(), f"{page.name}: {target} does not exist"
            assert ":start-after: LITERALINCLUDE START:" in options, f"{page.name}: {target} without a start marker"
            assert ":end-before: LITERALINCLUDE END:" in options, f"{page.name}: {target} without an end marker"

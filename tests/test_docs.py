"""The integration guide in docs/ builds without warnings, and its code excerpts cannot drift.

Every excerpt is a ``literalinclude`` between ``LITERALINCLUDE START/END`` marker comments. Sphinx
warns when a marker is missing, and ``-W`` turns the warning into a failed build: the negative test
checks that this really happens, so a renamed or deleted marker cannot go unnoticed. The marker check
finds what Sphinx does not: pairs that nest or overlap, excerpts no chapter uses, empty excerpts.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Every place a chapter includes code from (docs/ pulls excerpts from these only).
MARKED_SOURCES = [ROOT / p for p in ("openreg", "torch_openreg", "benchmarks", "tests", "examples", "scripts",
                                     "pyproject.toml", "setup.py")]
MARKER = re.compile(r"^\s*(?:#|//)\s*LITERALINCLUDE (START|END): (.+?)\s*$")  # a comment line of its own


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
            files.extend(p for p in place.rglob("*") if p.suffix in (".py", ".cpp", ".h", ".sh", ".toml"))
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


INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n((?::[^\n]*\n)*)```")


def marker_problems(sources: list[Path], pages: list[Path], root: Path) -> list[str]:
    """Everything wrong with the excerpt markers of ``sources`` as the chapters in ``pages`` use them.

    A START without its END (or the reverse, or twice in a file); pairs that nest or overlap (an
    excerpt would show the inner pair's marker lines, or half of another excerpt); a pair no chapter
    includes (dead weight in the code, and a sign that a chapter lost its excerpt); an excerpt with no
    code in it.
    """
    problems = []
    pairs: dict[tuple[Path, str], tuple[int, int]] = {}
    for path in sources:
        lines = path.read_text(errors="replace").splitlines()
        open_names: list[tuple[str, int]] = []
        seen: set[str] = set()
        for number, line in enumerate(lines, 1):
            match = MARKER.match(line)
            if not match:
                continue
            kind, name = match.groups()
            where = f"{path.relative_to(root)}:{number}"
            if kind == "START":
                if name in seen:
                    problems.append(f"{where}: START {name!r} twice in one file (an excerpt would be ambiguous)")
                if open_names:
                    problems.append(f"{where}: START {name!r} inside the pair {open_names[-1][0]!r} (no nesting)")
                seen.add(name)
                open_names.append((name, number))
            elif name not in [n for n, _ in open_names]:
                problems.append(f"{where}: END {name!r} without a START before it in this file")
            else:
                if open_names[-1][0] != name:
                    problems.append(f"{where}: END {name!r} closes across the pair {open_names[-1][0]!r} (overlap)")
                start = next(line for n, line in open_names if n == name)
                open_names = [(n, line) for n, line in open_names if n != name]
                pairs[(path.resolve(), name)] = (start, number)
                if not any(text.strip() for text in lines[start:number - 1]):
                    problems.append(f"{where}: the excerpt {name!r} is empty")
        problems.extend(f"{path.relative_to(root)}:{line}: START {n!r} is never closed" for n, line in open_names)
    used = set()
    for page in pages:
        for match in INCLUDE.finditer(page.read_text()):
            target, options = match.groups()
            start = re.search(r":start-after: LITERALINCLUDE START: (.+)", options)
            if start:
                key = ((page.parent / target).resolve(), start.group(1).strip())
                used.add(key)
                if key not in pairs:
                    problems.append(f"{page.name}: includes {target} {key[1]!r}, which is not a marker pair there")
    for (path, name), (line, _) in sorted(pairs.items()):
        if (path, name) not in used:
            problems.append(f"{path.relative_to(root.resolve())}:{line}: the excerpt {name!r} is in no chapter")
    return problems


def test_markers_pair_up_without_nesting_and_every_excerpt_is_used() -> None:
    problems = marker_problems(_source_files(), sorted(DOCS.glob("*.md")), ROOT)
    assert _source_files(), "no marked sources found: the source layout changed?"
    assert not problems, "\n".join(problems)


def test_marker_check_finds_each_kind_of_problem(tmp_path: Path) -> None:
    """The check above can fail: each problem in a small project is reported."""
    code = tmp_path / "code.py"
    code.write_text(
        "# LITERALINCLUDE START: GOOD\nA = 1\n# LITERALINCLUDE END: GOOD\n"
        "# LITERALINCLUDE START: UNUSED\nB = 2\n# LITERALINCLUDE END: UNUSED\n"
        "# LITERALINCLUDE START: OUTER\n# LITERALINCLUDE START: INNER\nC = 3\n"
        "# LITERALINCLUDE END: INNER\n# LITERALINCLUDE END: OUTER\n"
        "# LITERALINCLUDE START: LEFT\n# LITERALINCLUDE START: RIGHT\nD = 4\n"
        "# LITERALINCLUDE END: LEFT\n# LITERALINCLUDE END: RIGHT\n"
        "# LITERALINCLUDE START: EMPTY\n\n# LITERALINCLUDE END: EMPTY\n"
        '    text = "# LITERALINCLUDE START: IN A STRING"  # not a marker: the line does not start with it\n'
    )
    page = tmp_path / "page.md"
    page.write_text("".join(
        f"```{{literalinclude}} code.py\n:start-after: LITERALINCLUDE START: {name}\n"
        f":end-before: LITERALINCLUDE END: {name}\n```\n"
        for name in ("GOOD", "OUTER", "INNER", "LEFT", "RIGHT", "EMPTY", "MISSING")
    ))
    problems = marker_problems([code], [page], tmp_path)
    found = "\n".join(problems)
    assert "'INNER' inside the pair 'OUTER'" in found
    assert "'RIGHT' inside the pair 'LEFT'" in found and "END 'LEFT' closes across the pair 'RIGHT'" in found
    assert "'UNUSED' is in no chapter" in found
    assert "the excerpt 'EMPTY' is empty" in found
    assert "'MISSING', which is not a marker pair there" in found
    assert not any("GOOD" in p or "IN A STRING" in p for p in problems), found
    assert len(problems) == 6, found


def test_every_excerpt_comes_from_a_marker() -> None:
    """Code is never pasted into a chapter: fences are literalincludes (or plain-text diagrams)."""
    fence = re.compile(r"^```(\S*)", re.MULTILINE)
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        for match in fence.finditer(text):
            kind = match.group(1)
            if kind:  # an opening fence (closing fences have no info string)
                assert kind in ("{literalinclude}", "{toctree}", "text"), f"{page.name}: a ```{kind} block"
        for match in INCLUDE.finditer(text):
            target, options = match.groups()
            assert (page.parent / target).resolve().is_file(), f"{page.name}: {target} does not exist"
            assert ":start-after: LITERALINCLUDE START:" in options, f"{page.name}: {target} without a start marker"
            assert ":end-before: LITERALINCLUDE END:" in options, f"{page.name}: {target} without an end marker"

"""The README stays a short front page, and what points into it or into docs/ still leads
somewhere: relative links name files that exist, and pointers in the code such as
``docs/operations.md “Retention”`` or ``README “Install”`` name headings those files have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SKIP = {".venv", ".git", "build", "node_modules"}

# [text](target) and ![alt](target); the target ends at a space (a title) or the parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
# A file, then one or more quoted section names: README “X”, docs/page.md "X", “Y”. The name may
# follow on the next line of a docstring or of a # comment.
POINTER = re.compile(
    r"(?<![\w/.])(README(?:\.md)?|docs/[\w.-]+\.md)(?:\s|#)+"
    r"([“\"][^”\"\n]+[”\"](?:,(?:\s|#)*[“\"][^”\"\n]+[”\"])*)"
)
NAME = re.compile(r"[“\"]([^”\"\n]+)[”\"]")


def headings(page: Path) -> set[str]:
    """The page's headings as written, outside code blocks."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            found.add(m.group(1))
    return found


def python_files() -> list[Path]:
    """Every .py of the project but this one, whose examples point nowhere on purpose."""
    here = Path(__file__).resolve()
    return [
        p
        for p in ROOT.rglob("*.py")
        if not SKIP & set(p.relative_to(ROOT).parts) and p.resolve() != here
    ]


def test_readme_is_short() -> None:
    size = len(README.read_text())
    assert size <= 15_000, f"README.md has {size:,} characters; move text into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_files_that_exist(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the page itself
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_pointers_in_code_name_existing_sections() -> None:
    wrong = []
    for path in python_files():
        for m in POINTER.finditer(path.read_text()):
            page = ROOT / ("README.md" if m.group(1).startswith("README") else m.group(1))
            have = headings(page) if page.exists() else set()
            for name in NAME.findall(m.group(2)):
                if name not in have:
                    line = path.read_text().count("\n", 0, m.start()) + 1
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {m.group(1)} “{name}”")
    assert not wrong, "pointers to sections that do not exist:\n" + "\n".join(wrong)


def test_the_checks_see_a_wrong_pointer(tmp_path: Path) -> None:
    """The pattern finds both quote styles, lists of names, and names on the next line."""
    text = 'x (README “Install”, “Nowhere”)\n# see docs/design.md\n# "Guarantees"\n'
    found = [(m.group(1), NAME.findall(m.group(2))) for m in POINTER.finditer(text)]
    assert found == [("README", ["Install", "Nowhere"]), ("docs/design.md", ["Guarantees"])]

"""The documentation's links resolve: every relative link of README.md and docs/*.md names a
file of the repository and, with a `#fragment`, a heading of that file (GitHub's anchors); no
file cites a path outside the repository."""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*?|\[|\]\([^)]*\)", "", heading.strip()).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = github_anchor(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_github_anchor_matches_hand_examples():
    assert github_anchor(" 3.4 Online Debiasing") == "34-online-debiasing"
    assert github_anchor(" Synthetic bandits (`configs/bandit.py`)") == (
        "synthetic-bandits-configsbanditpy"
    )
    assert github_anchor(" 2026-12-05 — a: b -> c") == "2026-12-05--a-b---c"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    bad = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, frag = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no file {file}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag} in {dest.name}")
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
    assert not bad, f"{doc.name}: " + "; ".join(bad)

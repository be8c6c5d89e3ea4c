"""Every relative link in the repository's Markdown resolves: to a tracked file or folder, and
where it names an anchor (`file.md#section`, `#section`), to a heading of that file under
GitHub's slug rule (lower case; punctuation but `-` and `_` dropped; each space a `-`; a repeated
heading gets `-1`, `-2` …). Links to http(s)/mailto and links inside code are not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def tracked_markdown() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / n.decode() for n in out.split(b"\0") if n]


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a linked heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return out


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return LINK.findall(text)


def broken(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            bad.append(f"{path.relative_to(ROOT)}: {target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            bad.append(f"{path.relative_to(ROOT)}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return bad


def test_slug_follows_githubs_rule():
    assert slug("Faults: nothing admitted is lost") == "faults-nothing-admitted-is-lost"
    assert slug("EcoServe, spatial P/D and their baselines") == "ecoserve-spatial-pd-and-their-baselines"
    assert slug("Over HTTP (OpenAI-compatible)") == "over-http-openai-compatible"
    assert slug("`tokenyard up` and `--workers`") == "tokenyard-up-and---workers"


def test_checker_finds_a_dead_file_and_a_dead_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n## Two words\n[ok](#two-words) [ok](b.md) [bad](#nope) [bad](c.md)\n"
                                   "`[in code](gone.md)`\n```\n[fenced](gone.md)\n```\n[web](https://x.invalid/y)\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken(tmp_path / "a.md") == ["a.md: #nope (no heading #nope in a.md)", "a.md: c.md (no such file in the repository)"]


def test_every_relative_link_in_the_docs_resolves():
    files = tracked_markdown()
    assert ROOT / "README.md" in files and ROOT / "docs" / "ARCHITECTURE.md" in files
    assert sum(len(links(f)) for f in files) > 20  # the checker sees the links it is meant to check
    bad = [b for f in files for b in broken(f)]
    assert bad == [], "\n".join(bad)

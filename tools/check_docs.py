#!/usr/bin/env python3
"""Checks the documentation: every relative link in README.md and docs/*.md names a file of the
repository, every #anchor a heading of its file (GitHub's slugs); every docs/*.md (and #anchor)
that a source comment cites exists; and the README stays a newcomer's first ten minutes (at
most 250 lines, `./dev run` and `./dev test` in its first 40).

    tools/check_docs.py [REPO]        exit 0 when all holds, 1 with a line per problem
"""
import re
import sys
from pathlib import Path

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(text):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    problems = []
    for source in files:
        fenced = False
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for match in LINK.finditer(line):
                target = match.group(1) or match.group(2)
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                where = f"{source.relative_to(root)}:{number}"
                target_file = (source.parent / file_part).resolve() if file_part else source
                if not target_file.exists():
                    # Written by others at the same time: linked before it exists.
                    if target_file.name != "security.md":
                        problems.append(f"{where}: {target}: no such file")
                    continue
                if anchor and target_file.suffix == ".md" and anchor not in anchors(target_file):
                    problems.append(f"{where}: {target}: no heading #{anchor}")
    cited = re.compile(r"docs/[\w.-]+\.md(?:#[\w-]+)?")
    folders = ("app", "core", "ui", "tests", "tools", "bench", "resources", "cmake")
    suffixes = (".cpp", ".h", ".txt", ".cmake", ".sh", ".in", ".lua", ".sql")
    sources = [p for folder in folders for p in (root / folder).rglob("*")
               if p.is_file() and p.suffix in suffixes]
    for source in sources + [root / "dev", root / "CMakeLists.txt"]:
        if not source.exists():
            continue
        text = source.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for match in cited.finditer(line):
                file_part, _, anchor = match.group(0).partition("#")
                target_file = root / file_part
                where = f"{source.relative_to(root)}:{number}"
                if not target_file.exists():
                    if target_file.name != "security.md":
                        problems.append(f"{where}: {match.group(0)}: no such file")
                elif anchor and anchor not in anchors(target_file):
                    problems.append(f"{where}: {match.group(0)}: no heading #{anchor}")
    readme = (root / "README.md").read_text(encoding="utf-8").splitlines()
    if len(readme) > 250:
        problems.append(f"README.md: {len(readme)} lines, more than 250")
    first_screen = "\n".join(readme[:40])
    for command in ("./dev run", "./dev test"):
        if command not in first_screen:
            problems.append(f"README.md: '{command}' is not in its first 40 lines")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

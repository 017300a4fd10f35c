#!/usr/bin/env python3
"""Every relative link of README.md and docs/*.md leads somewhere: the file exists, and a
#fragment names a heading of that page (GitHub's slug: lower case, punctuation dropped, spaces
as hyphens) or an element's id. Prints FILE:LINE: LINK for each broken one, exit status 1 if any.

Usage: check_links.py [FILE.md ...] (default: README.md and docs/*.md of this repository)
"""

import pathlib
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
ID = re.compile(r"\bid=\"([^\"]+)\"")


def slug(title):
    title = re.sub(r"`|\*\*|\*", "", title).strip().lower()
    title = re.sub(r"[^\w\- ]", "", title)
    return title.replace(" ", "-")


def anchors(page):
    found, in_code = set(), False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            name, n = base, 1
            while name in found:  # GitHub numbers repeated headings
                name, n = f"{base}-{n}", n + 1
            found.add(name)
        found.update(ID.findall(line))
    return found


def check(page):
    broken, in_code = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page}:{number}: {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page}:{number}: {target}: no heading or id '{fragment}'")
    return broken


def main(argv):
    root = pathlib.Path(__file__).resolve().parents[2]
    pages = [pathlib.Path(a) for a in argv] or [root / "README.md",
                                                *sorted((root / "docs").glob("*.md"))]
    broken = [b for page in pages for b in check(page.resolve())]
    for b in broken:
        print(b)
    print(f"{len(broken)} broken links in {len(pages)} pages")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

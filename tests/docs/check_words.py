#!/usr/bin/env python3
"""Words a user-facing page must not hold: the project's work log is not the reader's business.

Banned in README.md and docs/*.md: issue numbers ("issue 24", "issue #3", "#3"), "the issue"
as the source of a target, work-session words ("this session", "fifth session"; MPI's sessions
are allowed), and "the seed" for the built-in example or the recall task (name them). Prints
FILE:LINE: WORD for each, exit status 1 if any. Without arguments it also checks that the
README still starts with its two commands, `make demo` and `make test`, and that CI runs the
second.

Usage: check_words.py [FILE.md ...] (default: README.md and docs/*.md beside this script's repo)
"""

import pathlib
import re
import sys

BANNED = [
    (re.compile(r"\bissues?\s*#?\s*\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w&/#])#\d+\b"), "an issue number"),
    (re.compile(r"\b(the|this|that|next|its) issue\b|\bissue's\b", re.I),
     "the work log's issue"),
    (re.compile(r"(?<!MPI )\bsessions?\b|\bsession's\b", re.I), "a work-session word"),
    (re.compile(r"\bthe seed\b|\bthe seed's\b", re.I),
     '"the seed" (say "the built-in example" or "the recall task")'),
]


def check(path):
    found = []
    for number, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").split("\n"), 1):
        for pattern, what in BANNED:
            for m in pattern.finditer(line):
                found.append(f"{path}:{number}: {what}: '{m.group(0)}'")
    return found


def check_readme_start(root):
    """The README starts with its two commands, and CI runs the second as the README says."""
    text = (root / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\w*\n(.*?)```", text, re.S)
    commands = [line.split("#")[0].strip() for line in block.group(1).strip().split("\n")] \
        if block else []
    found = []
    if commands != ["make demo", "make test"]:
        found.append(f"{root / 'README.md'}: the first block must be `make demo` and `make test`, "
                     f"not {commands}")
    if "step make test\n" not in (root / ".ci" / "run").read_text(encoding="utf-8"):
        found.append(f"{root / '.ci' / 'run'}: CI no longer runs the README's `make test`")
    return found


def main(argv):
    root = pathlib.Path(__file__).resolve().parents[2]
    pages = [pathlib.Path(a) for a in argv] or [root / "README.md",
                                                *sorted((root / "docs").glob("*.md"))]
    found = [hit for page in pages for hit in check(page)]
    if not argv:
        found += check_readme_start(root)
    for hit in found:
        print(hit)
    print(f"{len(found)} problems in {len(pages)} pages (banned words; the README's start)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

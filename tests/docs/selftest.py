#!/usr/bin/env python3
"""The docs tests can fail: run_snippets.py on a page with a failing block must exit 1 and name
that block's line (and the marker without a reason), while running the blocks before it, saved
files included; check_words.py on the same page must find its three banned words, and
check_links.py its two broken links (and not its good one)."""

import pathlib
import subprocess
import sys

here = pathlib.Path(__file__).resolve().parent
page = here / "selftest" / "page.md"
source, build = sys.argv[1], sys.argv[2]
lines = page.read_text().split("\n")
failing_line = next(i for i, line in enumerate(lines, 1) if line.startswith("raise SystemExit")) - 1
empty_marker_line = next(i for i, line in enumerate(lines, 1) if line == "<!-- not run: -->") + 1

run = subprocess.run([sys.executable, str(here / "run_snippets.py"), "--source", source,
                      "--build", build, "--python", sys.executable, str(page)],
                     capture_output=True, text=True)
print(run.stdout, run.stderr)
assert run.returncode == 1, f"the runner passed a page with a failing block ({run.returncode})"
assert f"FAIL {page}:{failing_line} (python)" in run.stderr, "the failing block is not named"
assert "SELFTEST-FAILURE" in run.stderr, "the failing block's output is not shown"
assert f"FAIL {page}:{empty_marker_line} (sh): a `not run` marker must give its reason" \
    in run.stderr, "a marker without a reason passed"
assert run.stderr.count("FAIL ") == 2, "a block that should pass failed"
assert "3 blocks run, 2 failed; 2 marked not run, 1 saved as files" in run.stdout, run.stdout

words = subprocess.run([sys.executable, str(here / "check_words.py"), str(page)],
                       capture_output=True, text=True)
print(words.stdout)
assert words.returncode == 1, "check_words.py passed a page with banned words"
for word in ("'issue 24'", "'session'", "'the seed'"):
    assert word in words.stdout, f"check_words.py missed {word}"
links = subprocess.run([sys.executable, str(here / "check_links.py"), str(page)],
                       capture_output=True, text=True)
print(links.stdout)
assert links.returncode == 1, "check_links.py passed a page with broken links"
assert "#no-such-heading: no heading or id 'no-such-heading'" in links.stdout
assert "no-such-file.md: no such file" in links.stdout
assert "2 broken links" in links.stdout, "a good link was reported broken"
print("the runner, the word check and the link check catch what they must")

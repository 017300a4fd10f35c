#!/usr/bin/env python3
"""Runs every fenced code block of the README and docs/ whose language can run, as a reader
would paste it, so that no snippet drifts from the code.

Languages run: sh/bash/shell (bash -e -o pipefail), python/py (the project's venv, with the
built module on PYTHONPATH), c and cpp (compiled against a scratch install of the library, then
run). Every other fence (text, cmake, output, none) is prose. A runnable block may carry a marker
on the line right before its fence:

    <!-- not run: REASON -->    the block is illustrative (it needs a model download, MPI, a
                                 benchmark's minutes, ...); REASON must say why
    <!-- save as FILE -->       the block is a file a later block uses (FILE is written, the
                                 block is not run)

The blocks of one page run in order in one scratch folder, which looks like the repository's
root: every top-level entry of the source tree is linked there, with `build` linked to the build
tree given, so `build/qkv`, `build/python` and `cmake --install build` work as in the README;
HOME is a folder inside it, so `~/...` stays inside too. Nothing is built: the executables and
the module must exist (ctest runs after the build).

Usage: run_snippets.py --source SRC --build BUILD [--python PY] [FILE.md ...]
(default: SRC/README.md and SRC/docs/*.md). Exit status 0 when every block ran, 1 otherwise.
"""

import argparse
import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

RUN_LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python",
                 "c": "c", "cpp": "cpp", "c++": "cpp"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(.*?)\s*-->\s*$")
SAVE_AS = re.compile(r"^\s*<!--\s*save as\s+([\w./-]+)\s*-->\s*$")
MARKER = re.compile(r"^\s*<!--\s*(not run|save as)\b")
TIMEOUT_S = 120


class Block:
    def __init__(self, path, line, language, text, marker):
        self.path, self.line, self.language, self.text, self.marker = (
            path, line, language, text, marker)

    def where(self):
        return f"{self.path}:{self.line}"


def parse_blocks(path):
    """The fenced blocks of a Markdown file, each with the marker line before it (or None)."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, language = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1  # the closing fence
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = lines[before] if before >= 0 and MARKER.match(lines[before]) else None
        blocks.append(Block(path, start + 1, language, "\n".join(body) + "\n", marker))
    return blocks


def make_root(scratch, source, build):
    """A folder that looks like the repository's root: links to the source tree's entries."""
    root = scratch / "repo"
    root.mkdir()
    for entry in sorted(source.iterdir()):
        if entry.name in (".git", "build"):
            continue
        (root / entry.name).symlink_to(entry)
    (root / "build").symlink_to(build)
    (scratch / "home").mkdir()
    return root


def environment(scratch, build, python):
    env = dict(os.environ)
    env["HOME"] = str(scratch / "home")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(build / "python"), env.get("PYTHONPATH", "")] if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # `python` and `python3` in a block are the project's venv, as in an activated venv.
    bindir = scratch / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = bindir / name
        if not link.exists():
            link.symlink_to(python)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PKG_CONFIG_PATH", None)
    env.setdefault("QKV_PROGRESS_AFTER", "1000")
    return env


def ensure_install(scratch, build, env, cache):
    """Installs the library once into a scratch prefix, for the C and C++ blocks."""
    if "prefix" not in cache:
        prefix = scratch / "install"
        subprocess.run(["cmake", "--install", str(build), "--prefix", str(prefix)], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        pc = next(prefix.rglob("qkv.pc"))
        cache["prefix"] = prefix
        cache["pkgconfig"] = pc.parent
    return cache["pkgconfig"]


def command_for(block, root, scratch, build, env, python, cache, index):
    """The command that runs a block (writing the files it needs), or None for a saved file."""
    kind = RUN_LANGUAGES[block.language]
    if kind == "sh":
        return ["bash", "-e", "-o", "pipefail", "-c", block.text]
    if kind == "python":
        script = scratch / f"snippet_{index}.py"
        script.write_text(block.text)
        return [str(python), str(script)]
    pkgconfig = ensure_install(scratch, build, env, cache)
    source = scratch / f"snippet_{index}.{'c' if kind == 'c' else 'cc'}"
    source.write_text(block.text)
    exe = scratch / f"snippet_{index}"
    compiler = (["cc", "-std=c99", "-Wall", "-Wextra", "-Werror"] if kind == "c"
                else ["c++", "-std=c++20", "-Wall", "-Wextra", "-Werror"])
    script = (f'export PKG_CONFIG_PATH="{pkgconfig}"\n'
              f'{" ".join(compiler)} "{source}" $(pkg-config --cflags --libs qkv) '
              f'-Wl,-rpath,"$(pkg-config --variable=libdir qkv)" -o "{exe}"\n"{exe}"\n')
    return ["bash", "-e", "-o", "pipefail", "-c", script]


def run_page(path, source, build, python, verbose):
    """Runs one page's blocks in order; returns (ran, skipped, saved, failures)."""
    blocks = [b for b in parse_blocks(path) if b.language in RUN_LANGUAGES]
    ran = skipped = saved = 0
    failures = []
    with tempfile.TemporaryDirectory(prefix="qkv-docs-") as tmp:
        scratch = pathlib.Path(tmp)
        root = make_root(scratch, source, build)
        env = environment(scratch, build, python)
        cache = {}
        for index, block in enumerate(blocks):
            if block.marker:
                not_run, save_as = NOT_RUN.match(block.marker), SAVE_AS.match(block.marker)
                if not_run:
                    if not not_run.group(1):
                        failures.append((block, "a `not run` marker must give its reason"))
                    skipped += 1
                    continue
                if save_as:
                    target = root / save_as.group(1)
                    if target.is_symlink() or target.exists() and not target.is_file():
                        failures.append((block, f"`save as {save_as.group(1)}` would replace "
                                                "an entry of the source tree"))
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(block.text)
                    saved += 1
                    continue
                failures.append((block, f"unknown marker {block.marker.strip()}"))
                continue
            started = time.monotonic()
            try:
                command = command_for(block, root, scratch, build, env, python, cache, index)
                result = subprocess.run(command, cwd=root, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        timeout=TIMEOUT_S, text=True, errors="replace")
                status, output = result.returncode, result.stdout
            except subprocess.TimeoutExpired as e:
                status, output = "timeout", (e.stdout or b"").decode(errors="replace") \
                    if isinstance(e.stdout, bytes) else (e.stdout or "")
            except (subprocess.CalledProcessError, StopIteration, OSError) as e:
                status, output = "error", str(e)
            seconds = time.monotonic() - started
            ran += 1
            if status != 0:
                tail = "\n".join(output.rstrip().split("\n")[-25:])
                failures.append((block, f"exit status {status} after {seconds:.1f} s:\n"
                                        f"--- the block ---\n{block.text}--- its output (last "
                                        f"lines) ---\n{tail}"))
            elif verbose:
                print(f"ok   {block.where()} ({block.language}, {seconds:.1f} s)")
    return ran, skipped, saved, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, type=pathlib.Path)
    parser.add_argument("--build", required=True, type=pathlib.Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("pages", nargs="*", type=pathlib.Path)
    args = parser.parse_args()
    source, build = args.source.resolve(), args.build.resolve()
    python = pathlib.Path(shutil.which(args.python) or args.python).absolute()
    pages = args.pages or [source / "README.md", *sorted((source / "docs").glob("*.md"))]
    for needed in (build / "qkv", build / "python" / "qkv"):
        if not needed.exists():
            print(f"{needed} is missing: build the project first (make)", file=sys.stderr)
            return 1
    totals = [0, 0, 0]
    failures = []
    started = time.monotonic()
    # Pages are independent (each has its own scratch folder), so they run side by side; the
    # blocks of one page run in order.
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, len(pages))) as pool:
        results = list(pool.map(
            lambda page: run_page(page.resolve(), source, build, python, not args.quiet), pages))
    for ran, skipped, saved, failed in results:
        totals = [totals[0] + ran, totals[1] + skipped, totals[2] + saved]
        failures += failed
    for block, why in failures:
        print(f"FAIL {block.where()} ({block.language}): {why}", file=sys.stderr)
    print(f"{totals[0]} blocks run, {len(failures)} failed; {totals[1]} marked not run, "
          f"{totals[2]} saved as files; {len(pages)} pages, {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

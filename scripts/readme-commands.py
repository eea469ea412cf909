#!/usr/bin/env python3
"""Run every command of README.md, so that the README cannot drift from what the code does.

Every fenced block whose language is `sh` is run, in the order of the README, each block as
one `bash -e -o pipefail` script from the repository root (as a reader who cloned the
repository types them), with the build's `release` directory first on PATH. A block fails the
run when it exits with a non-zero status or runs longer than --timeout seconds.

A block that must not run here says so, with the reason, in an HTML comment on the line
just before its opening fence (invisible on the rendered page):

    <!-- not run: this is the test suite itself -->

Keep those few. Blocks in other languages (`text`, `toml`, ...) are output or file contents,
never run.

A block's exit status is not enough to catch a broken tour (a program that prints the wrong
figures still exits 0), so a `text` block that shows the output of the `sh` block just above it
can be checked against that output. An HTML comment on the line just before its fence says so:

    <!-- output: each line below appears in the output of the block above -->
    <!-- output: each line below appears in the output above, except those with "pid " or "(/run" -->

Then every non-empty line of the text block (trailing blanks aside) must be a whole line of
what the sh block printed (stdout and stderr together), in any order, and a line shown twice
must be printed at least twice; blank lines are not compared; lines containing one of
the quoted strings after `except` (pids, paths, user names: what varies from run to run) are
not compared. A block that does not match fails the run, naming the missing lines.

Nothing is left behind: TMPDIR, XDG_RUNTIME_DIR and GPUSHIM_STATE_DIR point into a temporary
directory that is removed at the end, and the run fails when the blocks changed the
repository's work tree (`git status`, ignored build outputs aside). Relative links of the
README must name files that exist.

    python3 scripts/readme-commands.py           run them
    python3 scripts/readme-commands.py --list    show the blocks and whether each is run
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
OUTPUT = re.compile(r"^<!--\s*output:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)")


def blocks(path):
    """Yield (line number, language, text, not-run reason or None, output mark or None) for
    each fenced block; an output mark is the list of strings whose lines are not compared."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"{path}:{start + 1}: the block opened here is never closed")
        i += 1
        reason = output = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            n = NOT_RUN.match(lines[j].strip())
            if n:
                reason = n.group(1)
                if not reason:
                    sys.exit(f"{path}:{j + 1}: a 'not run' mark must say why")
            o = OUTPUT.match(lines[j].strip())
            if o:
                if lang == "sh":
                    sys.exit(f"{path}:{j + 1}: an 'output' mark belongs before a block of output, not an sh block")
                words = o.group(1)
                output = re.findall(r'"([^"]+)"', words.split("except", 1)[1]) if "except" in words else []
        yield start + 1, lang, "\n".join(body) + "\n", reason, output


def unmatched(expected, output, excepts):
    """The lines of an output block that the sh block's output does not hold."""
    got = collections.Counter(line.rstrip() for line in output.split("\n"))
    lost = []
    for line in expected.split("\n"):
        line = line.rstrip()
        if not line.strip() or any(e in line for e in excepts):
            continue
        if got[line] > 0:
            got[line] -= 1
        else:
            lost.append(line)
    return lost


def links(path):
    """Relative link targets of the README that do not exist."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        if file and not os.path.exists(os.path.join(os.path.dirname(path), file)):
            missing.append(target)
    return missing


def tree_state():
    """The work tree's status, or None outside a git work tree."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per block (600)")
    args = ap.parse_args()

    every = list(blocks(args.readme))
    # each sh block with the output blocks that check it: [(line, text, reason, [(line, text, excepts)])]
    found = []
    for line, lang, text, reason, output in every:
        if lang == "sh":
            found.append((line, text, reason, []))
        elif output is not None:
            prev = [b for b in every if b[0] < line]
            if not prev or prev[-1][1] != "sh" or prev[-1][3]:
                print(f"readme-commands: README.md:{line}: an 'output' mark must follow an sh block that is run",
                      file=sys.stderr)
                return 1
            found[-1][3].append((line, text, output))
    missing = links(args.readme)
    if args.list:
        for line, text, reason, checks in found:
            print(f"README.md:{line}: {'not run: ' + reason if reason else 'run'}")
            print("    " + text.rstrip().replace("\n", "\n    "))
            for cline, _, excepts in checks:
                print(f"    (its output is checked against README.md:{cline}"
                      f"{', except lines with ' + ', '.join(map(repr, excepts)) if excepts else ''})")
        return 0
    if missing:
        print("readme-commands: README.md links to files that do not exist: " + ", ".join(missing),
              file=sys.stderr)
        return 1
    if not found:
        print("readme-commands: README.md has no sh block", file=sys.stderr)
        return 1

    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    release = os.path.join(os.path.abspath(target), "release")
    before = tree_state()
    work = tempfile.mkdtemp(prefix="gpushim-readme-")
    env = dict(os.environ)
    env["PATH"] = release + os.pathsep + env.get("PATH", "")
    for name, sub in (("TMPDIR", "tmp"), ("XDG_RUNTIME_DIR", "run"), ("GPUSHIM_STATE_DIR", "state")):
        os.makedirs(os.path.join(work, sub), mode=0o700)
        env[name] = os.path.join(work, sub)
    failed = 0
    ran = skipped = checked = 0
    try:
        for line, text, reason, checks in found:
            if reason:
                print(f"== README.md:{line}: not run ({reason})", flush=True)
                skipped += 1
                continue
            print(f"== README.md:{line}:\n" + text.rstrip(), flush=True)
            ran += 1
            try:
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=ROOT, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=args.timeout)
                rc, output = p.returncode, p.stdout.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as e:
                sys.stdout.write((e.stdout or b"").decode("utf-8", "replace"))
                print(f"readme-commands: README.md:{line}: still running after {args.timeout} s",
                      file=sys.stderr)
                failed += 1
                continue
            sys.stdout.write(output)
            sys.stdout.flush()
            if rc != 0:
                print(f"readme-commands: README.md:{line}: the block exited with status {rc}",
                      file=sys.stderr)
                failed += 1
            for cline, expected, excepts in checks:
                lost = unmatched(expected, output, excepts)
                checked += 1
                if lost:
                    print(f"readme-commands: README.md:{cline}: the output shown here is not what the block at "
                          f"README.md:{line} printed; missing:\n" + "\n".join("    " + l for l in lost),
                          file=sys.stderr)
                    failed += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    after = tree_state()
    if before is not None and after != before:
        print("readme-commands: the README's commands changed the work tree:\n" + after,
              file=sys.stderr)
        failed += 1
    print(f"readme-commands: {ran} blocks run, {skipped} not run, {checked} outputs compared, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

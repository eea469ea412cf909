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

Nothing is left behind: TMPDIR, XDG_RUNTIME_DIR and GPUSHIM_STATE_DIR point into a temporary
directory that is removed at the end, and the run fails when the blocks changed the
repository's work tree (`git status`, ignored build outputs aside). Relative links of the
README must name files that exist.

    python3 scripts/readme-commands.py           run them
    python3 scripts/readme-commands.py --list    show the blocks and whether each is run
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(```+|~~~+)\s*([A-Za-z0-9_+-]*)")


def blocks(path):
    """Yield (line number, language, text, not-run reason or None) for each fenced block."""
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
        reason = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            n = NOT_RUN.match(lines[j].strip())
            if n:
                reason = n.group(1)
                if not reason:
                    sys.exit(f"{path}:{j + 1}: a 'not run' mark must say why")
        yield start + 1, lang, "\n".join(body) + "\n", reason


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

    found = [b for b in blocks(args.readme) if b[1] == "sh"]
    missing = links(args.readme)
    if args.list:
        for line, _, text, reason in found:
            print(f"README.md:{line}: {'not run: ' + reason if reason else 'run'}")
            print("    " + text.rstrip().replace("\n", "\n    "))
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
    ran = skipped = 0
    try:
        for line, _, text, reason in found:
            if reason:
                print(f"== README.md:{line}: not run ({reason})", flush=True)
                skipped += 1
                continue
            print(f"== README.md:{line}:\n" + text.rstrip(), flush=True)
            ran += 1
            try:
                rc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=ROOT, env=env,
                                    stdin=subprocess.DEVNULL, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                print(f"readme-commands: README.md:{line}: still running after {args.timeout} s",
                      file=sys.stderr)
                failed += 1
                continue
            if rc != 0:
                print(f"readme-commands: README.md:{line}: the block exited with status {rc}",
                      file=sys.stderr)
                failed += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    after = tree_state()
    if before is not None and after != before:
        print("readme-commands: the README's commands changed the work tree:\n" + after,
              file=sys.stderr)
        failed += 1
    print(f"readme-commands: {ran} blocks run, {skipped} not run, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

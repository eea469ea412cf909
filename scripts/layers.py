#!/usr/bin/env python3
"""The layers of gpushim's source, checked: a lower layer never imports a higher one.

Reads every `src/**.rs` (the library, the shared crate `gpushim-common` under src/common, and
the `gpushim` command under src/bin/gpushim), finds what each module imports (`crate::a::b`,
`$crate::…`, `super::…`, `self::…`, `gpushim_common::…`, `use crate::{a, b}`), maps each module
to its folder, the folder to its layer (LAYERS, declared once below), and fails (exit 1) when a
module imports one of a higher layer, naming file:line and both layers, or when a circle of
imports spans folders. Test code (`#[cfg(test)]` items and modules, files declared under
`#[cfg(test)]`) is not part of the layering and is skipped. Prints a drawing of the folder
graph; `--dot` prints it for Graphviz instead. No third-party modules.

    python3 scripts/layers.py          # check and draw
    python3 scripts/layers.py --dot    # Graphviz
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")

# The layers, bottom to top. A module's layer is that of the longest folder (relative to src/)
# that holds it; a layer may import any layer below it and its own, never one above.
LAYERS = [
    ("common/platform", "system calls, bounded waits, fork-aware once-cells (shared crate)"),
    ("common/settings", "environment, config file, units, secure execution (shared crate)"),
    ("common/state_files", "shared quotas, live figures: the state files' formats (shared crate)"),
    ("platform", "ELF symbols, the unwinder's object finder, the log, fork handlers"),
    ("driver", "C types, opening the driver, its function tables, MD2"),
    ("devices", "the view, the driver's devices, splits into program devices"),
    ("accounting", "budgets, live map, fast lane, reserves, modes, VMM, pools, graphs, teardown"),
    ("sharing", "joining a shared quota or the registry, publishing live figures"),
    ("placement", "the placement log"),
    ("state", "where the parts are put together (state.rs, state/), the exit report"),
    ("hooks", "the hook table, dlsym/cuGetProcAddress, hook bodies, NVML handles, private tables, the API"),
    ("bin/gpushim", "the gpushim command (uses the shared crate only)"),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}

# The crates: name as imported -> folder of its root (relative to src/), root file.
CRATES = {
    "gpushim": ("", "lib.rs"),
    "gpushim_common": ("common", "lib.rs"),
    "gpushim_cli": ("bin/gpushim", "main.rs"),
}


def rel(path):
    return os.path.relpath(path, SRC).replace(os.sep, "/")


def crate_of(relpath):
    if relpath.startswith("common/"):
        return "gpushim_common"
    if relpath.startswith("bin/gpushim/"):
        return "gpushim_cli"
    return "gpushim"


def module_path(relpath):
    """The module path of a file inside its crate, as a tuple of names."""
    base = CRATES[crate_of(relpath)][0]
    inner = relpath[len(base) + 1:] if base else relpath
    parts = inner[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def layer_of(relpath):
    """The layer holding a file, or None for a crate's root file (it only declares modules)."""
    if relpath in ("lib.rs", "common/lib.rs", "bin/gpushim/main.rs"):
        return None
    best = None
    for name in RANK:
        if relpath.startswith(name + "/") or relpath == name + ".rs":
            if best is None or len(name) > len(best):
                best = name
    return best


STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')
USE_GROUP = re.compile(r"\buse\s+(\$?crate|super|self|gpushim_common)::\{([^}]*)\}")
PATH = re.compile(r"(?<![\w:])(\$crate|crate|super|self|gpushim_common)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def code_lines(text):
    """(line number, code) for each line outside test-only code, comments and strings removed."""
    out = []
    skip_depth = None  # brace depth at which a test-only item started
    depth = 0
    pending_test = False
    for no, raw in enumerate(text.split("\n"), 1):
        line = raw.split("//", 1)[0] if not raw.lstrip().startswith("//") else ""
        line = STRING.sub('""', line)
        stripped = line.strip()
        if skip_depth is None and re.match(r"#\[cfg\((test|all\(test.*)\)\]", stripped):
            pending_test = True
            continue
        opens, closes = line.count("{"), line.count("}")
        if pending_test and stripped and not stripped.startswith("#["):
            pending_test = False
            if opens > closes:
                skip_depth = depth
            elif opens == 0 and not stripped.endswith(";"):
                skip_depth = depth  # the item's brace is on a later line
            depth += opens - closes
            continue
        depth += opens - closes
        if skip_depth is not None:
            if depth <= skip_depth and (opens or closes):
                skip_depth = None
            continue
        out.append((no, line))
    return out


def test_only_files(files):
    """Files declared with `#[cfg(test)] mod x;` (and everything under them)."""
    tests = set()
    for path in files:
        r = rel(path)
        text = open(path, encoding="utf-8").read()
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*;", text):
            d = os.path.dirname(r)
            stem = os.path.basename(r)[:-3]
            if stem not in ("mod", "lib", "main"):
                d = os.path.join(d, stem) if d else stem
            for cand in (f"{d}/{m.group(1)}.rs" if d else f"{m.group(1)}.rs", f"{d}/{m.group(1)}/mod.rs" if d else f"{m.group(1)}/mod.rs"):
                tests.add(cand.replace(os.sep, "/"))
    return tests


def main():
    dot = "--dot" in sys.argv[1:]
    files = []
    for dirpath, _, names in os.walk(SRC):
        for n in names:
            if n.endswith(".rs"):
                files.append(os.path.join(dirpath, n))
    files.sort()
    tests = test_only_files(files)
    modules = {}  # (crate, module path) -> relpath
    for path in files:
        r = rel(path)
        modules[(crate_of(r), module_path(r))] = r
    # gpushim_common's root re-exports (`pub use settings::{config, …}`)
    reexports = {}
    common_root = open(os.path.join(SRC, "common", "lib.rs"), encoding="utf-8").read()
    for m in re.finditer(r"pub use (\w+)::\{([^}]*)\};", common_root):
        for name in m.group(2).split(","):
            reexports[name.strip()] = (m.group(1), name.strip())

    # the command's root imports of the shared crate (`use gpushim_common::{config, …}`)
    cli_root = open(os.path.join(SRC, "bin", "gpushim", "main.rs"), encoding="utf-8").read()
    cli_aliases = set()
    for m in re.finditer(r"use gpushim_common::\{([^}]*)\};", cli_root):
        cli_aliases.update(n.strip() for n in m.group(1).split(","))

    def resolve(crate, here, head, tail):
        """The file a path names: the longest module prefix that is a file."""
        if head in ("crate", "$crate") and crate == "gpushim_cli" and tail and tail[0] in cli_aliases:
            head = "gpushim_common"
        if head in ("crate", "$crate"):
            parts = []
        elif head == "gpushim_common":
            crate, parts = "gpushim_common", []
            if tail and tail[0] in reexports:
                tail = list(reexports[tail[0]]) + tail[1:]
        elif head == "super":
            parts = list(here[:-1])
            while tail and tail[0] == "super":
                parts, tail = parts[:-1], tail[1:]
        else:  # self
            parts = list(here)
        full = parts + tail
        for k in range(len(full), 0, -1):
            r = modules.get((crate, tuple(full[:k])))
            if r is not None:
                return r
        return None

    edges = {}  # (from layer, to layer) -> first (file, line)
    errors = []
    for path in files:
        r = rel(path)
        if r in tests or any(r.startswith(t[:-3] + "/") for t in tests):
            continue
        src_layer = layer_of(r)
        if src_layer is None:
            continue
        crate, here = crate_of(r), module_path(r)
        text = open(path, encoding="utf-8").read()
        pending = None  # a `use` statement over several lines, joined: (first line, text)
        for no, line in code_lines(text):
            if pending is not None:
                pending = (pending[0], pending[1] + " " + line.strip())
                if ";" not in line:
                    continue
                no, line, pending = pending[0], pending[1], None
            elif re.match(r"\s*(pub(\([a-z]+\))?\s+)?use\b", line) and ";" not in line:
                pending = (no, line)
                continue
            targets = []
            for m in USE_GROUP.finditer(line):
                for item in m.group(2).split(","):
                    item = item.strip().split(" as ")[0].strip()
                    if item and item not in ("self", "*"):
                        targets.append((m.group(1), item.split("::")))
            for m in PATH.finditer(line):
                targets.append((m.group(1), m.group(2).split("::")[1:]))
            for head, tail in targets:
                target = resolve(crate, here, head, tail)
                if target is None:
                    continue
                dst_layer = layer_of(target)
                if dst_layer is None or dst_layer == src_layer:
                    continue
                edges.setdefault((src_layer, dst_layer), (r, no))
                if RANK[dst_layer] > RANK[src_layer]:
                    errors.append(f"src/{r}:{no}: layer '{src_layer}' imports '{dst_layer}' above it (src/{target})")

    # circles spanning folders (Tarjan's strongly connected components)
    graph = {name: sorted({b for (a, b) in edges if a == name}, key=RANK.get) for name in RANK}
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    for comp in sccs:
        errors.append("import circle spanning folders: " + " -> ".join(sorted(comp, key=RANK.get)))

    if dot:
        print("digraph layers {\n  rankdir=BT;\n  node [shape=box];")
        for name, what in LAYERS:
            print(f'  "{name}" [label="{name}\\n{what}"];')
        for (a, b) in sorted(edges, key=lambda e: (RANK[e[0]], RANK[e[1]])):
            colour = ' [color=red]' if RANK[b] > RANK[a] else ""
            print(f'  "{a}" -> "{b}"{colour};')
        print("}")
    else:
        width = max(len(n) for n, _ in LAYERS)
        print("gpushim's layers, top to bottom (each imports only those below it):\n")
        for name, what in reversed(LAYERS):
            below = [b for b in graph[name]]
            print(f"  {name:<{width}}  {what}")
            print(f"  {'':<{width}}    -> {', '.join(below) if below else '(nothing)'}")
        print()
    if errors:
        for e in errors:
            print("layers.py: error: " + e, file=sys.stderr)
        print(f"layers.py: {len(errors)} import(s) break the layering (see LAYERS in scripts/layers.py)", file=sys.stderr)
        return 1
    print(f"layers.py: ok: {len(files)} files, {len(LAYERS)} layers, no import goes up, no circle spans folders", file=sys.stderr if dot else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

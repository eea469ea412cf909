#!/usr/bin/env python3
"""The layers of gpushim's source, checked: a lower layer never imports a higher one.

Reads every `src/**.rs` (the library, the shared crate `gpushim-common` under src/common, and
the `gpushim` command under src/bin/gpushim) with a small Rust tokenizer (comments, strings,
raw strings, byte strings, char literals and lifetimes are told apart, so nothing inside a
string or a comment counts and line breaks between `crate`, `::` and names do not matter).
It builds each crate's module tree from its `mod` declarations (inline modules and `#[path]`
included), reads every path of the token stream (`crate::…`, `$crate::…`, `super::…`,
`self::…`, `::gpushim_common::…`, `gpushim_common::…`, names bound by `use … as …`,
`extern crate self as …`, glob imports and the crate roots' re-exports), resolves each to the
module holding what it names, maps that module's file to its folder and the folder to its
layer (LAYERS, declared once below). It fails (exit 1), naming file:line and both layers, when
a module imports one of a higher layer, when a circle of imports spans folders, and where
the check itself could be fooled:

  - a glob import of a crate root in a layer folder (`use crate::*`, `use super::*` from a
    folder's top module): it hides what it imports;
  - `#[path = …]` naming a file outside the declaring file's folder (and its subfolders), or
    `include!` of one (ALLOWED_PATHS lists exceptions; none today);
  - a macro defined in a higher layer invoked in a lower one;
  - a crate root (src/lib.rs, src/common/lib.rs) holding anything but `mod`, `use` (no
    glob), `extern crate` and attributes: the root belongs to no layer;
  - a file in no layer of LAYERS.

Test code — the item that follows `#[cfg(test)]` (or `#[cfg(all(test, …))]`): up to its `;`
or the `}` that closes it, counted on tokens, and files declared by such an item — is not part
of the layering and is skipped. Prints a drawing of the folder graph; `--dot` prints it for
Graphviz instead. Python 3 standard library only. scripts/layers-selftest.py checks that
each known way around it fails.

    python3 scripts/layers.py          # check and draw
    python3 scripts/layers.py --dot    # Graphviz
    python3 scripts/layers.py --src DIR  # check another copy of src/ (the self-test)
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
    ("compute", "compute share: the mode, the duty pacer and its turns, MPS variables, green contexts"),
    ("sharing", "joining a shared quota or the registry, publishing live figures"),
    ("placement", "the placement log"),
    ("state", "where the parts are put together (state.rs, state/), the exit report"),
    ("hooks", "the hook table, dlsym/cuGetProcAddress, hook bodies, NVML handles, private tables, the API"),
    ("bin/gpushim", "the gpushim command (uses the shared crate only)"),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}

# The crates: name as imported -> root file (relative to src/), and the crates each may name.
CRATES = {
    "gpushim": ("lib.rs", ("gpushim_common",)),
    "gpushim_common": ("common/lib.rs", ()),
    "gpushim_cli": ("bin/gpushim/main.rs", ("gpushim_common",)),
}
# Root files that belong to no layer: they may only declare modules and re-export.
BARE_ROOTS = ("lib.rs", "common/lib.rs")

# `#[path = …]` / `include!` targets allowed outside the declaring file's folder:
# (declaring file, named file), both relative to src/. None today.
ALLOWED_PATHS = set()


# ---------------------------------------------------------------------------------------------
# The tokenizer

class Tok:
    __slots__ = ("kind", "text", "line")

    def __init__(self, kind, text, line):
        self.kind, self.text, self.line = kind, text, line  # kind: id, str, lit, life, p

    def __repr__(self):
        return f"{self.kind}:{self.text}@{self.line}"


IDENT = re.compile(r"[^\W\d]\w*")
NUMBER = re.compile(r"\d\w*(?:\.\d\w*)?")
RAW_STR = re.compile(r'(?:b|c)?r(#*)"')
STR_START = re.compile(r'(?:b|c)?"')
CHAR = re.compile(r"b?'(?:\\(?:u\{[0-9a-fA-F_]*\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", re.S)
LIFETIME = re.compile(r"'[^\W\d]\w*")


class LexError(Exception):
    pass


def tokenize(text):
    """The tokens of Rust source, comments dropped; string tokens carry their contents."""
    toks = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c.isspace():
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while depth:
                if j >= n:
                    raise LexError(f"line {line}: a block comment is never closed")
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            line += text.count("\n", i, j)
            i = j
            continue
        m = RAW_STR.match(text, i)
        if m:
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            if j < 0:
                raise LexError(f"line {line}: a raw string is never closed")
            toks.append(Tok("str", text[m.end():j], line))
            line += text.count("\n", i, j)
            i = j + len(close)
            continue
        m = STR_START.match(text, i)
        if m:
            j, buf = m.end(), []
            while True:
                if j >= n:
                    raise LexError(f"line {line}: a string is never closed")
                ch = text[j]
                if ch == "\\":
                    buf.append(text[j + 1:j + 2])
                    j += 2
                    continue
                if ch == '"':
                    break
                buf.append(ch)
                j += 1
            toks.append(Tok("str", "".join(buf), line))
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if c == "'" or text.startswith("b'", i):
            m = CHAR.match(text, i)
            if m:
                toks.append(Tok("lit", m.group(0), line))
                i = m.end()
                continue
            m = LIFETIME.match(text, i)
            if m:
                toks.append(Tok("life", m.group(0), line))
                i = m.end()
                continue
            if c == "'":
                raise LexError(f"line {line}: a stray quote")
        if text.startswith("r#", i):
            m = IDENT.match(text, i + 2)
            if m:
                toks.append(Tok("id", m.group(0), line))
                i = m.end()
                continue
        if c == "$" and text.startswith("crate", i + 1) and not IDENT.match(text, i + 6):
            toks.append(Tok("id", "$crate", line))
            i += 6
            continue
        m = IDENT.match(text, i)
        if m:
            toks.append(Tok("id", m.group(0), line))
            i = m.end()
            continue
        m = NUMBER.match(text, i)
        if m:
            toks.append(Tok("lit", m.group(0), line))
            i = m.end()
            continue
        if text.startswith("::", i):
            toks.append(Tok("p", "::", line))
            i += 2
            continue
        toks.append(Tok("p", c, line))
        i += 1
    return toks


OPEN, CLOSE = "([{", ")]}"


def is_p(tok, text):
    return tok is not None and tok.kind == "p" and tok.text == text


def is_id(tok, text=None):
    return tok is not None and tok.kind == "id" and (text is None or tok.text == text)


def group_end(toks, i):
    """Index just past the bracket group opening at toks[i]."""
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "p" and t.text in OPEN:
            depth += 1
        elif t.kind == "p" and t.text in CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def cfg_test_only(pred):
    """Whether a cfg predicate (tokens inside `cfg(…)`) holds only when testing."""
    if len(pred) == 1 and is_id(pred[0], "test"):
        return True
    if len(pred) >= 3 and is_id(pred[0]) and is_p(pred[1], "("):
        args, cur, depth = [], [], 0
        for t in pred[2:-1]:
            if t.kind == "p" and t.text in OPEN:
                depth += 1
            elif t.kind == "p" and t.text in CLOSE:
                depth -= 1
            if depth == 0 and is_p(t, ","):
                args.append(cur)
                cur = []
            else:
                cur.append(t)
        if cur:
            args.append(cur)
        if pred[0].text == "all":
            return any(cfg_test_only(a) for a in args)
        if pred[0].text == "any":
            return bool(args) and all(cfg_test_only(a) for a in args)
    return False


def attribute(toks, i):
    """At `#` (`#!`) `[`: (end index, inner?, test-only?, the `path = "…"` values in it)."""
    j = i + 1
    inner = is_p(toks[j] if j < len(toks) else None, "!")
    if inner:
        j += 1
    end = group_end(toks, j)
    body = toks[j + 1:end - 1]
    test = (len(body) >= 3 and is_id(body[0], "cfg") and is_p(body[1], "(")
            and cfg_test_only(body[2:group_end(body, 1) - 1]))
    paths = [body[k + 2].text for k in range(len(body) - 2)
             if is_id(body[k], "path") and is_p(body[k + 1], "=") and body[k + 2].kind == "str"]
    return end, inner, test, paths


SEMI_ONLY = {"use", "static", "type", "let", "extern"}
# the words that start an item other than `mod`, `use` and `extern crate` (in a crate root: an error)
ITEM_WORDS = {"fn", "static", "const", "struct", "enum", "union", "trait", "impl", "type",
              "macro_rules", "unsafe", "async", "macro"}


def item_end(toks, i):
    """Index just past the item starting at toks[i]: its `;`, `,` or closing `}` at depth 0,
    or the closing bracket of what holds it (not included). Ends early rather than late."""
    k = i
    while is_id(toks[k] if k < len(toks) else None, "pub"):
        k += 1
        if is_p(toks[k] if k < len(toks) else None, "("):
            k = group_end(toks, k)
    first = toks[k] if k < len(toks) else None
    semi_only = is_id(first) and (first.text in SEMI_ONLY or (
        first.text == "const" and k + 1 < len(toks)
        and not is_id(toks[k + 1], "fn") and toks[k + 1].text not in ("unsafe", "async", "extern", "{")))
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "p":
            if t.text in OPEN:
                depth += 1
            elif t.text in CLOSE:
                if depth == 0:
                    return i
                depth -= 1
                if depth == 0 and t.text == "}" and not semi_only:
                    return i + 1
            elif depth == 0 and (t.text == ";" or (t.text == "," and not semi_only)):
                return i + 1
        i += 1
    return i


def live_tokens(toks):
    """(the tokens outside test-only code, [(module name, line, path attrs)] of `mod x;`
    items that are test-only, [(line, path value)] of every `#[path]` outside test code)."""
    out, test_mods, path_attrs = [], [], []
    i = 0
    while i < len(toks):
        t = toks[i]
        if is_p(t, "#") and i + 1 < len(toks) and (is_p(toks[i + 1], "[") or (
                is_p(toks[i + 1], "!") and i + 2 < len(toks) and is_p(toks[i + 2], "["))):
            end, inner, test, paths = attribute(toks, i)
            if inner and test:
                # the rest of the enclosing module (or file) is test code
                depth, j = 0, end
                while j < len(toks):
                    u = toks[j]
                    if u.kind == "p" and u.text in OPEN:
                        depth += 1
                    elif u.kind == "p" and u.text in CLOSE:
                        if depth == 0:
                            break
                        depth -= 1
                    j += 1
                i = j
                continue
            if test:
                j = end
                mod_paths = []
                while j < len(toks) and is_p(toks[j], "#") and j + 1 < len(toks) and is_p(toks[j + 1], "["):
                    e2, _, _, p2 = attribute(toks, j)
                    mod_paths += p2
                    j = e2
                e = item_end(toks, j)
                k = j
                while k < e and is_id(toks[k], "pub"):
                    k += 1
                    if k < e and is_p(toks[k], "("):
                        k = group_end(toks, k)
                if k + 2 < len(toks) and is_id(toks[k], "mod") and is_id(toks[k + 1]) and is_p(toks[k + 2], ";"):
                    test_mods.append((toks[k + 1].text, toks[k].line, mod_paths + paths))
                out.append(Tok("p", ";", t.line))  # what came before ends here (`#[path]`s included)
                i = e
                continue
            for p in paths:
                path_attrs.append((t.line, p))
            out.extend(toks[i:end])
            i = end
            continue
        out.append(t)
        i += 1
    return out, test_mods, path_attrs


# ---------------------------------------------------------------------------------------------
# Files, crates, modules

def crate_of(relpath):
    if relpath.startswith("common/"):
        return "gpushim_common"
    if relpath.startswith("bin/gpushim/"):
        return "gpushim_cli"
    return "gpushim"


def fs_module_path(relpath):
    """The module path a file has by where it lies (for a file no `mod` reaches)."""
    base = os.path.dirname(CRATES[crate_of(relpath)][0])
    inner = relpath[len(base) + 1:] if base else relpath
    parts = inner[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def layer_of(relpath):
    """The layer holding a file, or None for a crate root that belongs to none."""
    if relpath in BARE_ROOTS:
        return None
    best = None
    for name in RANK:
        if relpath.startswith(name + "/") or relpath == name + ".rs":
            if best is None or len(name) > len(best):
                best = name
    return best


def norm(path):
    return os.path.normpath(path).replace(os.sep, "/")


def within(path, folder):
    """Whether a normalised path relative to src/ lies in folder (or below it)."""
    if os.path.isabs(path) or path == ".." or path.startswith("../"):
        return False
    return folder in ("", ".") or path == folder or path.startswith(folder + "/")


class Analysis:
    def __init__(self, src):
        self.src = src
        self.files = sorted(norm(os.path.relpath(os.path.join(d, n), src))
                            for d, _, names in os.walk(src) for n in names if n.endswith(".rs"))
        self.errors = []
        self.toks = {}       # file -> live tokens
        self.test_files = set()
        self.path_attrs = {}
        for r in self.files:
            try:
                toks = tokenize(open(os.path.join(src, r), encoding="utf-8").read())
            except LexError as e:
                self.errors.append(f"src/{r}: cannot be read as Rust: {e}")
                toks = []
            live, test_mods, path_attrs = live_tokens(toks)
            self.toks[r] = live
            self.path_attrs[r] = path_attrs
            for name, _, paths in test_mods:
                for cand in self.child_files(r, (), name, paths):
                    self.test_files.add(cand)
        self.modules = {}     # (crate, path) -> file
        self.positions = {}   # file -> [(crate, path)]
        self.bindings = {}    # (crate, path) -> name -> [(crate, scope path, segments)]
        self.globs = {}       # (crate, path) -> [(crate, scope path, segments, file, line)]
        self.macros = {}      # name -> {file}
        for crate, (root, _) in CRATES.items():
            if root in self.toks:
                self.walk(crate, root, ())
        for r in self.files:
            if r not in self.positions and not self.is_test(r):
                pos = (crate_of(r), fs_module_path(r))
                self.modules.setdefault(pos, r)
                self.positions[r] = [pos]
        for r in self.files:
            if r in self.positions:
                self.declare(r)

    def is_test(self, r):
        return r in self.test_files or any(r.startswith(t[:-3] + "/") or
                                           (t.endswith("/mod.rs") and r.startswith(t[:-6]))
                                           for t in self.test_files)

    def child_files(self, r, inline, name, paths):
        """The candidate files of `mod name;` declared in file r inside inline modules."""
        d = os.path.dirname(r)
        stem = os.path.basename(r)[:-3]
        mod_rs = stem in ("mod", "lib", "main")
        if paths:
            base = d if not inline else os.path.join(d, *([] if mod_rs else [stem]), *inline)
            return [norm(os.path.join(base, p)) for p in paths]
        base = os.path.join(d, *([] if mod_rs else [stem]), *inline)
        return [norm(os.path.join(base, name + ".rs")), norm(os.path.join(base, name, "mod.rs"))]

    def walk(self, crate, r, path, seen=()):
        """Follow the `mod` declarations from file r, whose module is `path` in `crate`."""
        if (r, path) in seen or len(seen) > 64:
            return
        seen = seen + ((r, path),)
        self.modules.setdefault((crate, path), r)
        self.positions.setdefault(r, [])
        if (crate, path) not in self.positions[r]:
            self.positions[r].append((crate, path))
        toks = self.toks[r]
        stack = []  # inline modules: (name, brace depth)
        depth = 0
        pending_paths = []
        i = 0
        while i < len(toks):
            t = toks[i]
            if is_p(t, "#") and i + 1 < len(toks) and is_p(toks[i + 1], "["):
                end, _, _, paths = attribute(toks, i)
                pending_paths += paths
                i = end
                continue
            if is_id(t, "mod") and i + 2 < len(toks) and is_id(toks[i + 1]):
                name = toks[i + 1].text
                inline = [s[0] for s in stack]
                if is_p(toks[i + 2], ";"):
                    for cand in self.child_files(r, inline, name, pending_paths):
                        if cand in self.toks:
                            self.walk(crate, cand, path + tuple(inline) + (name,), seen)
                            break
                    pending_paths = []
                    i += 3
                    continue
                if is_p(toks[i + 2], "{"):
                    self.modules.setdefault((crate, path + tuple(inline) + (name,)), r)
                    stack.append((name, depth))
                    depth += 1
                    pending_paths = []
                    i += 3
                    continue
            if t.kind == "p" and t.text in OPEN:
                depth += 1
            elif t.kind == "p" and t.text in CLOSE:
                depth -= 1
                if stack and stack[-1][1] == depth:
                    stack.pop()
            if t.kind == "p" and t.text in ";{}":
                pending_paths = []
            i += 1

    # --- reading a file: its paths, `use` trees, macros -------------------------------------

    def scan(self, r):
        """Yield (kind, data) for file r at each of its module positions:
        ('path', (crate, here, segs, line)), ('use', (crate, here, segs, alias, glob, line)),
        ('extern', (crate, here, name, alias, line)), ('macro_def', (name, line)),
        ('macro_use', (name, line)), ('include', (line, literal or None)), ('item', (word, line))."""
        for crate, base in self.positions[r]:
            toks = self.toks[r]
            stack, depth, i = [], 0, 0
            while i < len(toks):
                t = toks[i]
                here = base + tuple(s[0] for s in stack)
                if is_p(t, "#") and i + 1 < len(toks) and (is_p(toks[i + 1], "[") or (
                        is_p(toks[i + 1], "!") and i + 2 < len(toks) and is_p(toks[i + 2], "["))):
                    i = attribute(toks, i)[0]
                    continue
                if depth == len(stack) and t.kind == "id" and t.text in ITEM_WORDS:
                    yield "item", (t.text, t.line)
                if is_id(t, "mod") and i + 2 < len(toks) and is_id(toks[i + 1]) and is_p(toks[i + 2], "{"):
                    stack.append((toks[i + 1].text, depth))
                    depth += 1
                    i += 3
                    continue
                if is_id(t, "use") and not is_p(toks[i - 1] if i else None, "::"):
                    j = i + 1
                    leaves = []
                    j = self.use_tree(toks, j, [], leaves)
                    for segs, alias, glob, line in leaves:
                        yield "use", (crate, here, segs, alias, glob, line)
                    i = j
                    continue
                if is_id(t, "extern") and i + 2 < len(toks) and is_id(toks[i + 1], "crate"):
                    name = toks[i + 2].text
                    alias = toks[i + 4].text if i + 4 < len(toks) and is_id(toks[i + 3], "as") else name
                    yield "extern", (crate, here, name, alias, t.line)
                    i += 3
                    continue
                if is_id(t, "macro_rules") and i + 2 < len(toks) and is_p(toks[i + 1], "!") and is_id(toks[i + 2]):
                    yield "macro_def", (toks[i + 2].text, t.line)
                    i += 3
                    continue
                if t.kind == "id" and i + 2 < len(toks) and is_p(toks[i + 1], "!") and toks[i + 2].text in OPEN:
                    if t.text in ("include",):
                        lit = toks[i + 3] if i + 4 < len(toks) and toks[i + 3].kind == "str" and is_p(toks[i + 4], ")") else None
                        yield "include", (t.line, lit.text if lit else None)
                    else:
                        yield "macro_use", (t.text, t.line)
                if (t.kind == "id" or is_p(t, "::")) and not is_p(toks[i - 1] if i else None, "::"):
                    segs, j = self.path_at(toks, i)
                    if segs:
                        yield "path", (crate, here, segs, t.line)
                        if j + 1 < len(toks) and is_p(toks[j], "!") and toks[j + 1].text in OPEN:
                            yield "macro_use", (segs[-1], t.line)
                    if j > i:
                        i = j
                        continue
                if t.kind == "p" and t.text in OPEN:
                    depth += 1
                elif t.kind == "p" and t.text in CLOSE:
                    depth -= 1
                    if stack and stack[-1][1] == depth:
                        stack.pop()
                i += 1

    @staticmethod
    def path_at(toks, i):
        """The path starting at toks[i] (a leading `::` kept as the segment '::'), and the index
        past its last name (`i` when it is not a path of two or more segments)."""
        segs, j = [], i
        if is_p(toks[j], "::"):
            if j + 1 < len(toks) and is_id(toks[j + 1]):
                segs.append("::")
                j += 1
            else:
                return [], i
        segs.append(toks[j].text)
        j += 1
        while j + 1 < len(toks) and is_p(toks[j], "::") and is_id(toks[j + 1]):
            segs.append(toks[j + 1].text)
            j += 2
        if len(segs) < 2:
            return [], i
        return segs, j

    def use_tree(self, toks, j, prefix, leaves):
        """Parse a `use` tree from toks[j]; append (segments, alias, glob?, line); return the
        index past it (past the `;` at the top)."""
        top = not prefix
        segs = list(prefix)
        line = toks[j].line if j < len(toks) else 0
        if j < len(toks) and is_p(toks[j], "::"):
            if not segs:
                segs.append("::")
            j += 1
        while j < len(toks):
            t = toks[j]
            if t.kind == "id" and t.text != "as":
                segs.append(t.text)
                line = t.line
                j += 1
                if j < len(toks) and is_p(toks[j], "::"):
                    j += 1
                    continue
                alias = None
                if j + 1 < len(toks) and is_id(toks[j], "as"):
                    alias = toks[j + 1].text
                    j += 2
                if segs[-1] == "self" and len(segs) > 1:
                    segs = segs[:-1]
                leaves.append((segs, alias if alias is not None else segs[-1], False, line))
                break
            if is_p(t, "*"):
                leaves.append((segs, None, True, t.line))
                j += 1
                break
            if is_p(t, "{"):
                j += 1
                while j < len(toks) and not is_p(toks[j], "}"):
                    if is_p(toks[j], ","):
                        j += 1
                        continue
                    j = self.use_tree(toks, j, segs, leaves)
                j += 1
                break
            j += 1  # anything unexpected: move on
            break
        if top:
            while j < len(toks) and not is_p(toks[j], ";"):
                j += 1
            j += 1
        return j

    def declare(self, r):
        """Record the names file r binds (`use`, `extern crate … as`), its globs and macros."""
        for kind, data in self.scan(r):
            if kind == "use":
                crate, here, segs, alias, glob, line = data
                node = (crate, here)
                if glob:
                    self.globs.setdefault(node, []).append((crate, here, segs, r, line))
                elif alias and alias != "_":
                    self.bindings.setdefault(node, {}).setdefault(alias, []).append((crate, here, segs))
            elif kind == "extern":
                crate, here, name, alias, line = data
                segs = ["crate"] if name == "self" else ["::", name]
                self.bindings.setdefault((crate, here), {}).setdefault(alias, []).append((crate, here, segs))
                if here == () and r == CRATES[crate][0]:
                    self.bindings.setdefault((crate, "extern"), {}).setdefault(alias, []).append((crate, here, segs))
            elif kind == "macro_def":
                self.macros.setdefault(data[0], set()).add(r)

    # --- resolving ---------------------------------------------------------------------------

    def lookup(self, node, name, seen):
        """The absolute paths (crate, path) that `name` names in module `node`."""
        key = (node, name)
        if key in seen or len(seen) > 200:
            return []
        seen.add(key)
        crate, here = node
        out = []
        for c, scope, segs in self.bindings.get(node, {}).get(name, []):
            out += self.resolve(c, scope, segs, seen)
        if (crate, here + (name,)) in self.modules:
            out.append((crate, here + (name,)))
        for c, scope, segs, _, _ in self.globs.get(node, []):
            for g in self.resolve(c, scope, segs, seen):
                out += self.lookup(g, name, seen)
        return out

    def resolve(self, crate, here, segs, seen=None, finals=None):
        """The modules (crate, path) a path passes through, re-exports followed; `finals`
        gets the modules it ends at when every segment names a module."""
        if seen is None:
            seen = set()
        head, rest = segs[0], list(segs[1:])
        if head == "::":
            head, rest = rest[0], rest[1:]
            bases = [(head, ())] if head in CRATES and head in CRATES[crate][1] else []
        elif head in ("crate", "$crate"):
            bases = [(crate, ())]
        elif head == "self":
            bases = [(crate, here)]
        elif head == "super":
            bases = [(crate, here[:-1])] if here else []
        else:
            bases = self.lookup((crate, here), head, seen)
            if not bases:
                for c, scope, s in self.bindings.get((crate, "extern"), {}).get(head, []):
                    bases += self.resolve(c, scope, s, seen)
            if not bases and head in CRATES[crate][1]:
                bases = [(head, ())]
        out = []  # every module the path passes through: naming a module is using it
        for c, cur in bases:
            out.append((c, cur))
            for k, seg in enumerate(rest):
                if seg == "super":
                    cur = cur[:-1]
                elif seg == "self":
                    pass
                elif (c, cur + (seg,)) in self.modules:
                    cur = cur + (seg,)
                else:
                    for m in self.lookup((c, cur), seg, seen):
                        out += self.resolve(m[0], m[1], ["self"] + rest[k + 1:], seen, finals)
                    break
                out.append((c, cur))
            else:
                if finals is not None:
                    finals.append((c, cur))
        return out

    def file_of(self, node):
        crate, path = node
        for k in range(len(path), -1, -1):
            r = self.modules.get((crate, path[:k]))
            if r is not None:
                return r
        return None


# ---------------------------------------------------------------------------------------------

def check(src):
    """(errors, edges, number of files) for the tree under src."""
    a = Analysis(src)
    errors = list(a.errors)
    edges = {}  # (from layer, to layer) -> first (file, line)

    def reach(r, src_layer, line, nodes):
        upward = {}  # layer above -> the last (deepest) file of it the path reaches
        for node in nodes:
            target = a.file_of(node)
            if target is None:
                continue
            dst_layer = layer_of(target)
            if dst_layer is None or dst_layer == src_layer:
                continue
            edges.setdefault((src_layer, dst_layer), (r, line))
            if RANK[dst_layer] > RANK[src_layer]:
                upward[dst_layer] = target
        for dst_layer, target in upward.items():
            errors.append(f"src/{r}:{line}: layer '{src_layer}' imports '{dst_layer}' above it (src/{target})")

    for r in a.files:
        if r not in a.positions:
            continue  # test-only
        src_layer = layer_of(r)
        for line, p in a.path_attrs.get(r, []):
            named = norm(os.path.join(os.path.dirname(r), p))
            if not within(named, os.path.dirname(r)) and (r, named) not in ALLOWED_PATHS:
                errors.append(f"src/{r}:{line}: #[path = \"{p}\"] names src/{named}, outside the folder "
                              f"of the file that declares it (layer '{src_layer}')")
        if src_layer is None:
            if r in BARE_ROOTS:
                for kind, data in a.scan(r):
                    if kind == "item":
                        errors.append(f"src/{r}:{data[1]}: the crate root holds a '{data[0]}' item; it "
                                      f"belongs to no layer: put it in a layer folder")
                    if kind == "include":
                        errors.append(f"src/{r}:{data[0]}: include! in a crate root")
                    if kind == "use" and data[4]:
                        errors.append(f"src/{r}:{data[5]}: a glob import in the crate root hides what it "
                                      f"makes reachable under crate::: name what it re-exports")
                continue
            errors.append(f"src/{r}: is in no layer: add its folder to LAYERS in scripts/layers.py")
            continue
        for kind, data in a.scan(r):
            if kind == "path":
                crate, here, segs, line = data
                reach(r, src_layer, line, a.resolve(crate, here, segs))
            elif kind == "use":
                crate, here, segs, alias, glob, line = data
                if not segs:
                    continue
                finals = []
                nodes = a.resolve(crate, here, segs, None, finals)
                if glob:
                    for node in finals:
                        if node[1] == ():
                            errors.append(f"src/{r}:{line}: glob import of the crate root hides what it "
                                          f"imports (layer '{src_layer}'): name what it uses")
                reach(r, src_layer, line, nodes)
            elif kind == "extern":
                crate, here, name, alias, line = data
                if name == "self":
                    reach(r, src_layer, line, [(crate, ())])
            elif kind == "include":
                line, lit = data
                named = norm(os.path.join(os.path.dirname(r), lit)) if lit is not None else None
                if named is None or (not within(named, os.path.dirname(r)) and (r, named) not in ALLOWED_PATHS):
                    errors.append(f"src/{r}:{line}: include! of {('src/' + named) if named else 'a computed path'}, "
                                  f"outside the folder of the file (layer '{src_layer}')")
                else:
                    nl = layer_of(named)
                    if nl and nl != src_layer and RANK[nl] > RANK[src_layer]:
                        errors.append(f"src/{r}:{line}: layer '{src_layer}' includes '{nl}' above it (src/{named})")
            elif kind == "macro_use":
                name, line = data
                defs = a.macros.get(name, set())
                if r in defs:
                    continue
                for d in sorted(defs):
                    dl = layer_of(d)
                    if dl is not None and dl != src_layer and crate_of(d) == crate_of(r):
                        edges.setdefault((src_layer, dl), (r, line))
                        if RANK[dl] > RANK[src_layer]:
                            errors.append(f"src/{r}:{line}: layer '{src_layer}' invokes {name}! of "
                                          f"'{dl}' above it (src/{d})")
    return errors, edges, len(a.files)


def main():
    args = sys.argv[1:]
    dot = "--dot" in args
    src = SRC
    if "--src" in args:
        src = args[args.index("--src") + 1]
    errors, edges, nfiles = check(src)

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
        seen = set()
        for e in errors:
            if e not in seen:
                seen.add(e)
                print("layers.py: error: " + e, file=sys.stderr)
        print(f"layers.py: {len(seen)} import(s) break the layering (see LAYERS in scripts/layers.py)", file=sys.stderr)
        return 1
    print(f"layers.py: ok: {nfiles} files, {len(LAYERS)} layers, no import goes up, no circle spans folders",
          file=sys.stderr if dot else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

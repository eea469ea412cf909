#!/usr/bin/env python3
"""scripts/layers.py's self-test: each known way around the layer check must fail it.

Each case below plants a few lines of ordinary Rust into a temporary copy of `src/` (most
into src/driver/table.rs, a low layer, reaching `state` above it) and runs
`layers.py --src COPY`: a case marked FAIL must exit 1 naming the file and line it expects, a
case marked PASS (comments and strings that only look like imports) must exit 0. The real
tree must pass. Python 3 standard library only; run by scripts/test.sh.

    python3 scripts/layers-selftest.py
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = os.path.join(HERE, "layers.py")
SRC = os.path.join(HERE, "..", "src")
LOW = "driver/table.rs"

# (name, expect, {file: text appended}, the message must contain)
CASES = [
    ("a single-line upward use", "FAIL", {LOW: "use crate::state::State;\n"},
     "layer 'driver' imports 'state' above it"),
    ("a multi-line upward use", "FAIL", {LOW: "use crate::{\n    devices,\n    state::State,\n};\n"},
     "layer 'driver' imports 'state'"),
    ("use crate::* then state::get()", "FAIL", {LOW: "use crate::*;\nfn f() { state::get(); }\n"},
     "glob import of the crate root hides what it imports"),
    ("use super::super::* then state::get()", "FAIL", {LOW: "use super::super::*;\nfn f() { state::get(); }\n"},
     "glob import of the crate root"),
    ("use super::* in a folder's top module", "FAIL", {"driver/mod.rs": "use super::*;\n"},
     "glob import of the crate root"),
    ("use crate as root", "FAIL", {LOW: "use crate as root;\nfn f() { root::state::get(); }\n"},
     "imports 'state'"),
    ("use crate::{self as root}", "FAIL", {LOW: "use crate::{self as root};\nfn f() { root::state::get(); }\n"},
     "imports 'state'"),
    ("use super::super as up", "FAIL", {LOW: "use super::super as up;\nfn f() { up::state::get(); }\n"},
     "imports 'state'"),
    ("extern crate self as root", "FAIL", {LOW: "extern crate self as me;\nfn f() { me::state::get(); }\n"},
     "imports 'state'"),
    ("an alias reached through a glob of the folder's module", "FAIL",
     {"driver/mod.rs": "#[allow(unused)]\npub(crate) use crate as root;\n",
      LOW: "use super::*;\nfn f() { root::state::get(); }\n"},
     f"src/{LOW}:"),
    ("// inside a string", "FAIL", {LOW: 'fn f() { foo("https://x", crate::state::get()); }\n'},
     "imports 'state'"),
    ("/* inside a string", "FAIL", {LOW: 'fn f() { foo("/*", crate::state::get(), "*/"); }\n'},
     "imports 'state'"),
    ("a one-line #[cfg(test)] item, then real code", "FAIL",
     {LOW: "#[cfg(test)] use std::ffi::CString;\nuse crate::state::State;\n"},
     "imports 'state'"),
    ("#[cfg(test)] and another attribute over one item, then real code", "FAIL",
     {LOW: "#[cfg(test)]\n#[allow(unused)]\nuse std::ffi::CString;\nuse crate::state::State;\n"},
     "imports 'state'"),
    ("a brace in a string of a test module", "FAIL",
     {LOW: '#[cfg(test)]\nmod tests {\n    const S: &str = "{\n";\n}\nfn f() { crate::state::get(); }\n'},
     "imports 'state'"),
    ("braces in a raw string and char literals of test code", "FAIL",
     {LOW: "#[cfg(test)]\nmod tests {\n    const R: &str = r#\"{ \"a\": \"}\" {\"#;\n"
           "    fn g<'a>(_x: &'a str) -> char { '{' }\n    const B: &[u8] = b\"{{\";\n}\n"
           "fn f() { crate::state::get(); }\n"},
     "imports 'state'"),
    ("a #[cfg(test)] fn, then real code on its last line", "FAIL",
     {LOW: "#[cfg(test)]\nfn t() {\n}  fn f() { crate::state::get(); }\n"},
     "imports 'state'"),
    ("#[cfg(any(test, unix))] is not test-only", "FAIL",
     {LOW: "#[cfg(any(test, unix))]\nuse crate::state::State;\n"},
     "imports 'state'"),
    ("crate :: state (spaces)", "FAIL", {LOW: "fn f() { crate :: state::get(); }\n"},
     "imports 'state'"),
    ("a path split across lines", "FAIL", {LOW: "fn f() {\n    crate::\n        state\n        ::get();\n}\n"},
     f"src/{LOW}:"),
    ("a path with a comment inside", "FAIL", {LOW: "fn f() { crate:: /* x */ state::get(); }\n"},
     "imports 'state'"),
    ("#[path] to a higher layer's file", "FAIL",
     {LOW: '#[path = "../state/x.rs"]\nmod x;\n', "state/x.rs": "pub fn get() {}\n"},
     '#[path = "../state/x.rs"]'),
    ("#[path] in the crate root, then the module used", "FAIL",
     {"lib.rs": '#[path = "state/x.rs"]\nmod sx;\n', "state/x.rs": "pub fn get() {}\n",
      LOW: "fn f() { crate::sx::get(); }\n"},
     "imports 'state'"),
    ("include! of a higher layer's file", "FAIL", {LOW: 'include!("../state/report.rs");\n'},
     "include!"),
    ("super::super:: climbing into another folder", "FAIL",
     {LOW: "fn f() { super::super::state::get(); }\n"}, "imports 'state'"),
    ("super:: from an inline module", "FAIL",
     {LOW: "mod a {\n    mod b {\n        fn f() { super::super::super::super::state::get(); }\n    }\n}\n"},
     "imports 'state'"),
    ("$crate:: in a macro", "FAIL",
     {LOW: "macro_rules! m {\n    () => {\n        $crate::state::get()\n    };\n}\n"},
     "imports 'state'"),
    ("a higher layer's macro invoked", "FAIL",
     {"state/report.rs": "#[macro_export]\nmacro_rules! sneaky {\n    () => {};\n}\n",
      LOW: "fn f() { sneaky!(); }\n"},
     "invokes sneaky!"),
    ("a higher layer's macro invoked by its path", "FAIL",
     {"state/report.rs": "#[macro_export]\nmacro_rules! sneaky {\n    () => {};\n}\n",
      LOW: "fn f() { $crate::sneaky!(); }\n"},
     "invokes sneaky!"),
    ("#[path] with an absolute path", "FAIL",
     {LOW: '#[path = "/etc/x.rs"]\nmod x;\n'}, "outside the folder"),
    ("#[path] after pub, in the crate root", "FAIL",
     {"lib.rs": '#[path = "state/x.rs"]\npub(crate) mod sx;\n', "state/x.rs": "pub fn get() {}\n",
      LOW: "fn f() { crate::sx::get(); }\n"},
     "imports 'state'"),
    ("a re-export in the crate root", "FAIL",
     {"lib.rs": "#[allow(unused)]\nuse state::get as sget;\n", LOW: "fn f() { crate::sget(); }\n"},
     "imports 'state'"),
    ("a re-export in a higher layer's module, reached by a lower path", "FAIL",
     {"driver/mod.rs": "pub(crate) use crate::state::get;\n"}, "src/driver/mod.rs:"),
    ("a glob re-export in the crate root, then an item of it", "FAIL",
     {"lib.rs": "#[allow(unused)]\npub(crate) use state::*;\n", LOW: "fn f() { crate::get(); }\n"},
     "a glob import in the crate root"),
    ("an item in the crate root", "FAIL", {"lib.rs": "fn helper() {}\n"}, "the crate root holds"),
    ("gpushim_common: a root re-export that reaches a higher layer", "FAIL",
     {"common/platform/once.rs": "fn f() { crate::units::parse_size(\"1\"); }\n"},
     "layer 'common/platform' imports 'common/settings'"),
    ("gpushim_common: a full path upward", "FAIL",
     {"common/platform/once.rs": "fn f() { crate::state_files::live::x(); }\n"},
     "imports 'common/state_files'"),
    ("a file in no layer", "FAIL", {"bin/other.rs": "fn main() {}\n"}, "is in no layer"),
    # controls: what only looks like an import must pass
    ("comments and strings (control)", "PASS",
     {LOW: "// crate::state::get()\n/* /* nested */ crate::state::get() */\n"
           'const S: &str = "crate::state::get()";\nconst R: &str = r#"crate::state"#;\n'
           "/// use crate::state;\nfn f<'a>(_x: &'a str) -> char { 'c' }\n"}, ""),
    ("test code (control)", "PASS",
     {LOW: '#[cfg(test)]\nmod t2 {\n    use crate::state::State;\n    const S: &str = "}";\n}\n'
           "#[cfg(all(test, unix))]\nuse crate::hooks;\n"}, ""),
]


def run(src):
    p = subprocess.run([sys.executable, LAYERS, "--src", src], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def plant_and_run(work, k, plants):
    copy = os.path.join(work, str(k), "src")
    shutil.copytree(SRC, copy)
    for rel, text in plants.items():
        path = os.path.join(copy, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return run(copy)


def main():
    failed = 0
    rc, out = run(SRC)
    if rc != 0:
        print("layers-selftest: the real tree fails layers.py:\n" + out, file=sys.stderr)
        failed += 1
    work = tempfile.mkdtemp(prefix="gpushim-layers-")
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda kc: plant_and_run(work, kc[0], kc[1][2]), enumerate(CASES)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for (name, expect, _, needle), (rc, out) in zip(CASES, results):
        ok = (rc == 0) if expect == "PASS" else (rc == 1 and needle in out)
        if not ok:
            failed += 1
            print(f"layers-selftest: FAILED: {name}: expected {expect}"
                  f"{' with ' + repr(needle) if needle else ''}, layers.py exited {rc}:", file=sys.stderr)
            print("    " + "\n    ".join(l for l in out.splitlines() if "layers.py" in l), file=sys.stderr)
    if failed:
        print(f"layers-selftest: {failed} check(s) failed", file=sys.stderr)
    else:
        print(f"layers-selftest: ok: the real tree passes, {len(CASES)} planted cases as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

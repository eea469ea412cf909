//! Where `libgpushim.so` is, and how it goes into `LD_PRELOAD`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::config::ENV_LIBRARY;
use crate::Failure;

pub const FILE_NAME: &str = "libgpushim.so";

/// The library to preload: `--library`, else `GPUSHIM_LIBRARY`, else next to this executable
/// (a cargo build: `target/release/`), else `../lib/` from it (an installed tree:
/// `PREFIX/bin/gpushim`, `PREFIX/lib/libgpushim.so`). Always an absolute path.
pub fn find(command: &str, flag: Option<&Path>, env: &[(OsString, OsString)]) -> Result<PathBuf, Failure> {
    let named = flag
        .map(|p| (p.to_path_buf(), "--library"))
        .or_else(|| lookup(env, ENV_LIBRARY).filter(|v| !v.is_empty()).map(|v| (PathBuf::from(v), ENV_LIBRARY)));
    if let Some((path, from)) = named {
        return match std::fs::canonicalize(&path) {
            Ok(p) if p.is_file() => Ok(p),
            Ok(_) => Err(Failure::setup(command, format!("{from} {}: not a file", path.display()))),
            Err(e) => Err(Failure::setup(command, format!("{from} {}: {e}", path.display()))),
        };
    }
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| Failure::setup(command, format!("cannot locate the gpushim executable: {e}; pass --library PATH")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(FILE_NAME), dir.join("../lib").join(FILE_NAME)];
    for c in &candidates {
        if let Ok(p) = std::fs::canonicalize(c) {
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(Failure::setup(
        command,
        format!(
            "cannot find {FILE_NAME} at {} or {}; pass --library /path/to/{FILE_NAME} or set {ENV_LIBRARY}",
            candidates[0].display(),
            candidates[1].display()
        ),
    ))
}

/// `LD_PRELOAD` with `library` first, each other entry kept once (entries are separated by
/// spaces or colons, as ld.so reads them).
pub fn preload(library: &Path, current: Option<&OsStr>) -> OsString {
    let mut out = OsString::from(library);
    if let Some(current) = current.and_then(OsStr::to_str) {
        for entry in current.split([' ', ':']).filter(|e| !e.is_empty()) {
            if Path::new(entry) != library {
                out.push(":");
                out.push(entry);
            }
        }
    } else if let Some(current) = current.filter(|c| !c.is_empty()) {
        // not UTF-8: keep it whole
        out.push(":");
        out.push(current);
    }
    out
}

pub fn lookup<'a>(env: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
    env.iter().rev().find(|(n, _)| n.as_os_str() == name).map(|(_, v)| v.as_os_str())
}

/// Sets `name` in `env`, replacing an earlier value.
pub fn set(env: &mut Vec<(OsString, OsString)>, name: &str, value: impl Into<OsString>) {
    env.retain(|(n, _)| n.as_os_str() != name);
    env.push((name.into(), value.into()));
}

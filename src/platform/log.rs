//! The shim's log: levels, one `write(2)` per line, and a rate limiter for lines that a busy
//! program could trigger thousands of times (refused allocations).
//!
//! Nothing here runs, and nothing is printed, until the program first asks for a CUDA function.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

/// The levels are the configuration's own (`GPUSHIM_LOG`).
pub use gpushim_common::config::LogLevel as Level;

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);
static FD: AtomicI32 = AtomicI32::new(2);

/// Sets the level and, when given, the file lines go to (appended; stderr if it cannot be opened,
/// with one line saying so).
pub fn configure(level: Level, file: Option<&std::path::Path>) {
    LEVEL.store(level as u8, Relaxed);
    let Some(path) = file else { return };
    use std::os::unix::ffi::OsStrExt;
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return };
    // (O_NONBLOCK: a FIFO put at the path must not hang the program's first CUDA call; only a
    // regular file or a device is kept, then written blocking)
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: `cpath` is a valid NUL-terminated string; open(2) has no other preconditions.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags, 0o644) };
    let refused = match fd {
        fd if fd < 0 => Some(std::io::Error::last_os_error().to_string()),
        fd => match writable_kind(fd) {
            Ok(()) => None,
            Err(why) => {
                // SAFETY: closing the descriptor just opened.
                unsafe { libc::close(fd) };
                Some(why.to_string())
            }
        },
    };
    match refused {
        None => FD.store(fd, Relaxed),
        Some(err) => emit(Level::Warn, format_args!("cannot open log file {}: {err}; logging to stderr", path.display())),
    }
}

/// A regular file or a character device (made blocking again); anything else (a FIFO, a
/// socket) is refused.
fn writable_kind(fd: i32) -> Result<(), &'static str> {
    // SAFETY: `st` is a valid out-pointer for fstat of an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { gpushim_common::sys::fstat(fd, &mut st) } != 0 {
        return Err("cannot stat it");
    }
    if !matches!(st.st_mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFCHR) {
        return Err("not a regular file");
    }
    // SAFETY: fcntl on an open descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND) };
    Ok(())
}

#[inline]
pub fn enabled(level: Level) -> bool {
    Level::ALL.get(LEVEL.load(Relaxed) as usize).is_some_and(|configured| configured.enables(level))
}

/// Writes `gpushim: LEVEL: message` as one line.
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    let mut line = String::with_capacity(160);
    let _ = write!(line, "gpushim: {}: ", level.as_str());
    let _ = line.write_fmt(args);
    line.push('\n');
    write_raw(line.as_bytes());
}

/// Writes an already formatted line (adds the newline), with no level word: configuration
/// errors use the exact form `gpushim: SETTING="VALUE": REASON`.
pub fn emit_plain(text: &str) {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    write_raw(line.as_bytes());
}

/// [`emit`] without allocating: the line formatted on the stack (cut at 511 bytes), for lines
/// written where the thread may have been interrupted inside the allocator (`bounded`). Cold
/// and never inlined: its buffer must not sit in the frames of start-up (README: stack use).
#[cold]
#[inline(never)]
pub fn emit_unallocated(level: Level, args: fmt::Arguments<'_>) {
    struct Line {
        buf: [u8; 512],
        len: usize,
    }
    impl fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let n = s.len().min(self.buf.len() - 1 - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let mut line = Line { buf: [0; 512], len: 0 };
    let _ = write!(line, "gpushim: {}: ", level.as_str());
    let _ = line.write_fmt(args);
    line.buf[line.len] = b'\n';
    write_raw(&line.buf[..line.len + 1]);
}

fn write_raw(mut bytes: &[u8]) {
    let fd = FD.load(Relaxed);
    if fd != 2 && !within_file_size_limit(fd, bytes.len()) {
        return;
    }
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            return;
        }
    }
}

/// Whether the log file `fd` can take `len` more bytes within the process' file size limit
/// (`ulimit -f`): a write past it raises `SIGXFSZ`, which kills a program that does not ignore
/// it. The line is dropped otherwise. (stderr is the program's own: not checked.)
fn within_file_size_limit(fd: i32, len: usize) -> bool {
    let Ok(limit) = gpushim_common::sys::file_size_limit() else { return true };
    if limit == u64::MAX {
        return true;
    }
    // SAFETY: `st` is a valid out-pointer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of a descriptor, writing `st`.
    if unsafe { gpushim_common::sys::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return true;
    }
    (st.st_size as u64).saturating_add(len as u64) <= limit
}

macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::platform::log::enabled($level) {
            $crate::platform::log::emit($level, format_args!($($arg)*))
        }
    };
}
pub(crate) use log;

/// Lets a burst of `PER_SECOND` lines through each second and counts the rest, so a program
/// retrying a refused allocation in a loop cannot flood its own output.
pub struct RateLimit {
    second: AtomicU64,
    in_second: AtomicU32,
    suppressed: AtomicU64,
}

impl RateLimit {
    const PER_SECOND: u32 = 5;

    pub const fn new() -> Self {
        RateLimit { second: AtomicU64::new(u64::MAX), in_second: AtomicU32::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(n)`: print the line, mentioning that `n` lines were suppressed since the last one.
    pub fn admit(&self) -> Option<u64> {
        let now = coarse_seconds();
        if self.second.swap(now, Relaxed) != now {
            self.in_second.store(0, Relaxed);
        }
        if self.in_second.fetch_add(1, Relaxed) < Self::PER_SECOND {
            Some(self.suppressed.swap(0, Relaxed))
        } else {
            self.suppressed.fetch_add(1, Relaxed);
            None
        }
    }
}

fn coarse_seconds() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64
}

/// Refuses `call` because a wait of the shim gave up (`bounded`): one line ([`stuck`]), and
/// `result`, its answer (`CUDA_ERROR_OUT_OF_MEMORY` for an allocation,
/// `CUDA_ERROR_NOT_PERMITTED` for other calls).
#[cold]
pub fn refuse(call: &str, why: gpushim_common::bounded::Stuck, result: std::ffi::c_int) -> std::ffi::c_int {
    stuck(call, why);
    result
}

/// Says why `call` was refused or left undone because a wait gave up: one `warn` line,
/// rate-limited, formatted without allocating (the thread may have been interrupted inside
/// the C library's allocator).
#[cold]
pub fn stuck(call: &str, why: gpushim_common::bounded::Stuck) {
    static LINES: RateLimit = RateLimit::new();
    if enabled(Level::Warn) {
        match LINES.admit() {
            Some(0) => emit_unallocated(Level::Warn, format_args!("{call} refused: {why}")),
            Some(n) => emit_unallocated(Level::Warn, format_args!("{call} refused: {why} ({n} similar lines suppressed)")),
            None => {}
        }
    }
}

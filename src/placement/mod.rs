//! The placement log (`GPUSHIM_LOG_PLACEMENT`): TensorFlow's `log_device_placement` for any
//! CUDA program, at the level the driver sees — kernels and allocations.
//!
//! While it is on, the first launch of each kernel on each device, the first launch of each
//! executable graph on each device (a graph is counted as one launch, not per node) and the
//! first allocation through each API on each device print one line: what, where (the program's
//! device ordinal, the GPU's index and UUID, the part of a split GPU) and on which stream.
//! Later ones are only counted; the exit report (`report`) adds a summary per device.
//!
//! Kernel names come from the driver (`cuFuncGetName`, `cuKernelGetName`, CUDA 12.3+) or, on
//! older drivers, from the names the program looked kernels up by (`cuModuleGetFunction`,
//! `cuLibraryGetKernel`, `cuKernelGetFunction`), which the shim then remembers.
//!
//! While it is off, none of this exists: the launch and lookup hooks are not handed out
//! (`place` in the hook table) and the allocation paths test one `Option`.
//!
//! Its locks are bounded (`bounded`); a record whose lock cannot be had is left out (a count
//! or a line missing from the log, never a call refused for it).

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::fmt::Write as _;
use std::sync::Arc;

use gpushim_common::bounded::{Bounded, Guard};

use crate::driver::ffi::*;

/// The placement log's records (present only while it is on).
pub struct Placement {
    /// Kernel names by function or library-kernel handle, with the module or library that owns
    /// the handle (0: unknown), so that an unload retires its handles.
    pub(crate) names: Bounded<HashMap<usize, (Arc<str>, usize)>>,
    /// Launches of handles retired by an unload (or of graphs destroyed), by (device, kernel
    /// name) and (device, graph): the handle may be reused by the driver for something else.
    pub(crate) retired: Bounded<HashMap<(CUdevice, Arc<str>), u64>>,
    pub(crate) retired_graphs: Bounded<Vec<(CUdevice, usize, u64)>>,
    /// Launches per (program device, what was launched): kernels by handle (their names are
    /// looked up once, at the first launch), graphs by executable graph.
    pub(crate) launches: Bounded<HashMap<(CUdevice, Launched), u64, Fast>>,
    /// Allocations per (program device, API): how many, how many bytes.
    pub(crate) allocations: Bounded<Allocations>,
    /// Where each device is, as printed (filled by the first line about it, read by the report).
    pub(crate) places: Bounded<HashMap<CUdevice, Place>>,
    /// The (device, kernel name) pairs a line was printed for: handles of the same name (a
    /// module's function, a library's kernel, one per context) print one line.
    pub(crate) printed: Bounded<std::collections::HashSet<(CUdevice, Arc<str>)>>,
}

/// What a launch ran, by handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Launched {
    /// A function or library kernel.
    Kernel(usize),
    /// An executable graph.
    Graph(usize),
}

/// Where a program device is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// The GPU's index among all GPUs (NVML's, as `nvidia-smi` shows it), when NVML is there.
    pub gpu_index: Option<usize>,
    /// The GPU's UUID (`GPU-…`).
    pub uuid: Option<String>,
    /// For a part of a split GPU: (index from 0, count).
    pub part: Option<(u32, u32)>,
}

impl Place {
    pub(crate) fn describe(&self, dev: CUdevice) -> String {
        if dev < 0 {
            return "no device (no current context)".to_string();
        }
        let mut s = format!("device {dev}");
        let gpu: Vec<String> = [self.gpu_index.map(|i| format!("GPU {i}")), self.uuid.clone()].into_iter().flatten().collect();
        if !gpu.is_empty() || self.part.is_some() {
            s.push_str(" (");
            s.push_str(&gpu.join(" "));
            if let Some((i, n)) = self.part {
                let _ = write!(s, "{}part {} of {n}", if gpu.is_empty() { "" } else { ", " }, i + 1);
            }
            s.push(')');
        }
        s
    }
}

/// One device's summary for the exit report.
pub struct DeviceSummary {
    pub ordinal: CUdevice,
    pub place: Place,
    /// (kernel name, launches), by name.
    pub kernels: Vec<(String, u64)>,
    /// (graph handle, launches).
    pub graphs: Vec<(usize, u64)>,
    /// (API, allocations, bytes), by API.
    pub allocations: Vec<(&'static str, u64, u64)>,
}

/// The launch path's maps hash with the live map's cheap hasher (keys are handles).
type Fast = std::hash::BuildHasherDefault<crate::accounting::memory::FastHasher>;

/// Allocations per (program device, API): how many, how many bytes.
type Allocations = HashMap<(CUdevice, &'static str), (u64, u64), Fast>;

/// `m` locked; `None` (after one line) when it cannot be had: the record is left out.
pub(crate) fn lock<T>(m: &Bounded<T>) -> Option<Guard<'_, T>> {
    m.lock().map_err(|stuck| crate::platform::log::stuck("a record of the placement log", stuck)).ok()
}

const WHAT: &str = "gpushim's placement log";

impl Placement {
    pub fn new() -> Self {
        Placement {
            names: Bounded::new(WHAT, HashMap::new()),
            retired: Bounded::new(WHAT, HashMap::new()),
            retired_graphs: Bounded::new(WHAT, Vec::new()),
            launches: Bounded::new(WHAT, HashMap::default()),
            allocations: Bounded::new(WHAT, HashMap::default()),
            places: Bounded::new(WHAT, HashMap::new()),
            printed: Bounded::new(WHAT, std::collections::HashSet::new()),
        }
    }

    /// Takes its locks for a fork (`fork`).
    pub fn hold_for_fork(&'static self) {
        crate::platform::fork::hold(&self.names);
        crate::platform::fork::hold(&self.retired);
        crate::platform::fork::hold(&self.retired_graphs);
        crate::platform::fork::hold(&self.launches);
        crate::platform::fork::hold(&self.allocations);
        crate::platform::fork::hold(&self.places);
        crate::platform::fork::hold(&self.printed);
    }

    /// A forked child starts counting afresh (it writes no report); it keeps the names.
    pub fn reset_after_fork(&self) {
        self.launches.reset_after_fork(HashMap::default());
        self.retired.reset_after_fork(HashMap::new());
        self.retired_graphs.reset_after_fork(Vec::new());
        self.allocations.reset_after_fork(HashMap::default());
        self.printed.reset_after_fork(std::collections::HashSet::new());
    }
}

impl Default for Placement {
    fn default() -> Self {
        Self::new()
    }
}

/// `name` as the program gave it (NULL or invalid UTF-8 shown lossily).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub(crate) unsafe fn name_text(name: *const c_char) -> Option<Arc<str>> {
    // SAFETY: per the contract.
    (!name.is_null()).then(|| Arc::from(unsafe { CStr::from_ptr(name) }.to_string_lossy().as_ref()))
}

pub(crate) fn stream_text(stream: CUstream, per_thread: bool) -> String {
    match stream as usize {
        0 if per_thread => "the per-thread default stream".to_string(),
        0 => "the default stream".to_string(),
        STREAM_LEGACY => "the legacy default stream".to_string(),
        STREAM_PER_THREAD => "the per-thread default stream".to_string(),
        s => format!("stream {s:#x}"),
    }
}


/// One placement line (printed unless the log is off).
pub(crate) fn line(text: &str) {
    if crate::platform::log::enabled(crate::platform::log::Level::Error) {
        crate::platform::log::emit_plain(&format!("gpushim: placement: {text}"));
    }
}

/// The summary as text (the exit report's placement section).
pub fn text(summary: &[DeviceSummary]) -> String {
    let mut s = format!("gpushim placement (pid {}):\n", std::process::id());
    if summary.is_empty() {
        s.push_str("  nothing was launched or allocated\n");
    }
    for d in summary {
        let _ = writeln!(s, "  {}:", d.place.describe(d.ordinal));
        for (name, n) in &d.kernels {
            let _ = writeln!(s, "    kernel {name}: {n} launch{}", if *n == 1 { "" } else { "es" });
        }
        for (g, n) in &d.graphs {
            let _ = writeln!(s, "    graph {g:#x}: {n} launch{}", if *n == 1 { "" } else { "es" });
        }
        for (what, n, bytes) in &d.allocations {
            let _ = writeln!(s, "    {what}: {n} allocation{}, {bytes} bytes", if *n == 1 { "" } else { "s" });
        }
    }
    s
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The summary as a JSON array (the exit report's `placement` field).
pub fn json(summary: &[DeviceSummary]) -> String {
    let devices: Vec<String> = summary
        .iter()
        .map(|d| {
            let opt = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
            let kernels: Vec<String> = d.kernels.iter().map(|(name, n)| format!("{{\"name\":{},\"launches\":{n}}}", json_string(name))).collect();
            let graphs: Vec<String> = d.graphs.iter().map(|(g, n)| format!("{{\"graph\":\"{g:#x}\",\"launches\":{n}}}")).collect();
            let allocations: Vec<String> =
                d.allocations.iter().map(|(what, n, bytes)| format!("{{\"api\":\"{what}\",\"count\":{n},\"bytes\":{bytes}}}")).collect();
            format!(
                "{{\"ordinal\":{},\"gpu_index\":{},\"uuid\":{},\"part\":{},\"kernels\":[{}],\"graphs\":[{}],\"allocations\":[{}]}}",
                d.ordinal,
                opt(d.place.gpu_index.map(|i| i.to_string())),
                opt(d.place.uuid.as_deref().map(json_string)),
                opt(d.place.part.map(|(i, n)| format!("{{\"index\":{i},\"count\":{n}}}"))),
                kernels.join(","),
                graphs.join(","),
                allocations.join(",")
            )
        })
        .collect();
    format!("[{}]", devices.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_read_well() {
        let whole = Place { gpu_index: Some(2), uuid: Some("GPU-ab".into()), part: None };
        assert_eq!(whole.describe(0), "device 0 (GPU 2 GPU-ab)");
        let part = Place { gpu_index: Some(0), uuid: Some("GPU-cd".into()), part: Some((1, 4)) };
        assert_eq!(part.describe(3), "device 3 (GPU 0 GPU-cd, part 2 of 4)");
        assert_eq!(Place::default().describe(1), "device 1");
        assert_eq!(Place::default().describe(-1), "no device (no current context)");
    }

    #[test]
    fn summaries_format() {
        let s = [DeviceSummary {
            ordinal: 1,
            place: Place { gpu_index: Some(0), uuid: Some("GPU-x".into()), part: None },
            kernels: vec![("a\"b".into(), 3)],
            graphs: vec![(0x10, 1)],
            allocations: vec![("cuMemAlloc", 2, 4096)],
        }];
        assert_eq!(
            json(&s),
            "[{\"ordinal\":1,\"gpu_index\":0,\"uuid\":\"GPU-x\",\"part\":null,\"kernels\":[{\"name\":\"a\\\"b\",\"launches\":3}],\"graphs\":[{\"graph\":\"0x10\",\"launches\":1}],\"allocations\":[{\"api\":\"cuMemAlloc\",\"count\":2,\"bytes\":4096}]}]"
        );
        let t = text(&s);
        assert!(t.contains("  device 1 (GPU 0 GPU-x):\n    kernel a\"b: 3 launches\n    graph 0x10: 1 launch\n    cuMemAlloc: 2 allocations, 4096 bytes\n"), "{t}");
    }

    #[test]
    fn streams_read_well() {
        assert_eq!(stream_text(std::ptr::null_mut(), false), "the default stream");
        assert_eq!(stream_text(std::ptr::null_mut(), true), "the per-thread default stream");
        assert_eq!(stream_text(2 as CUstream, false), "the per-thread default stream");
        assert_eq!(stream_text(0x40 as CUstream, false), "stream 0x40");
    }
}

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
use std::ffi::{c_char, c_void, CStr};
use std::fmt::Write as _;
use std::sync::Arc;

use gpushim_common::bounded::{Bounded, Guard};

use crate::driver::ffi::*;
use crate::state::State;

/// The placement log's records (present only while it is on).
pub struct Placement {
    /// Kernel names by function or library-kernel handle, with the module or library that owns
    /// the handle (0: unknown), so that an unload retires its handles.
    names: Bounded<HashMap<usize, (Arc<str>, usize)>>,
    /// Launches of handles retired by an unload (or of graphs destroyed), by (device, kernel
    /// name) and (device, graph): the handle may be reused by the driver for something else.
    retired: Bounded<HashMap<(CUdevice, Arc<str>), u64>>,
    retired_graphs: Bounded<Vec<(CUdevice, usize, u64)>>,
    /// Launches per (program device, what was launched): kernels by handle (their names are
    /// looked up once, at the first launch), graphs by executable graph.
    launches: Bounded<HashMap<(CUdevice, Launched), u64, Fast>>,
    /// Allocations per (program device, API): how many, how many bytes.
    allocations: Bounded<Allocations>,
    /// Where each device is, as printed (filled by the first line about it, read by the report).
    places: Bounded<HashMap<CUdevice, Place>>,
    /// The (device, kernel name) pairs a line was printed for: handles of the same name (a
    /// module's function, a library's kernel, one per context) print one line.
    printed: Bounded<std::collections::HashSet<(CUdevice, Arc<str>)>>,
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
    fn describe(&self, dev: CUdevice) -> String {
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
fn lock<T>(m: &Bounded<T>) -> Option<Guard<'_, T>> {
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
unsafe fn name_text(name: *const c_char) -> Option<Arc<str>> {
    // SAFETY: per the contract.
    (!name.is_null()).then(|| Arc::from(unsafe { CStr::from_ptr(name) }.to_string_lossy().as_ref()))
}

fn stream_text(stream: CUstream, per_thread: bool) -> String {
    match stream as usize {
        0 if per_thread => "the per-thread default stream".to_string(),
        0 => "the default stream".to_string(),
        STREAM_LEGACY => "the legacy default stream".to_string(),
        STREAM_PER_THREAD => "the per-thread default stream".to_string(),
        s => format!("stream {s:#x}"),
    }
}

impl State {
    /// The placement log, when on.
    #[inline]
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// Remembers the name a function or library kernel `handle` was looked up by.
    ///
    /// # Safety
    /// `name` is NULL or a NUL-terminated string.
    /// `owner`: the module or library it came from.
    pub unsafe fn remember_kernel_name(&self, handle: *mut c_void, name: *const c_char, owner: *mut c_void) {
        let Some(p) = self.placement() else { return };
        // SAFETY: per the contract.
        if let (false, Some(name)) = (handle.is_null(), unsafe { name_text(name) }) {
            self.retire(p, &[handle as usize]);
            if let Some(mut names) = lock(&p.names) {
                names.insert(handle as usize, (name, owner as usize));
            }
        }
    }

    /// Module or library `owner` was unloaded: its handles' launches are kept by name, and
    /// the handles forgotten (the driver may hand them out again).
    pub fn forget_kernels_of(&self, owner: *mut c_void) {
        let Some(p) = self.placement() else { return };
        if owner.is_null() {
            return;
        }
        let Some(names) = lock(&p.names) else { return };
        let handles: Vec<usize> = names.iter().filter(|(_, (_, o))| *o == owner as usize).map(|(h, _)| *h).collect();
        drop(names);
        self.retire(p, &handles);
    }

    /// Executable graph `exec` was destroyed: its launches are kept, the handle forgotten.
    pub fn forget_graph(&self, exec: *mut c_void) {
        let Some(p) = self.placement() else { return };
        let gone: Vec<(CUdevice, u64)> = {
            let Some(mut launches) = lock(&p.launches) else { return };
            let keys: Vec<(CUdevice, Launched)> = launches.keys().filter(|(_, w)| *w == Launched::Graph(exec as usize)).copied().collect();
            keys.into_iter().filter_map(|k| launches.remove(&k).map(|n| (k.0, n))).collect()
        };
        if let Some(mut retired) = lock(&p.retired_graphs) {
            retired.extend(gone.into_iter().map(|(d, n)| (d, exec as usize, n)));
        }
    }

    /// Moves the launches of kernel handles `handles` to their names' totals and forgets them.
    fn retire(&self, p: &Placement, handles: &[usize]) {
        if handles.is_empty() {
            return;
        }
        let named: Vec<(usize, Arc<str>)> = {
            let Some(mut names) = lock(&p.names) else { return };
            handles.iter().filter_map(|h| names.remove(h).map(|(n, _)| (*h, n))).collect()
        };
        let moved: Vec<(CUdevice, Arc<str>, u64)> = {
            let Some(mut launches) = lock(&p.launches) else { return };
            let keys: Vec<(CUdevice, Launched)> =
                launches.keys().filter(|(_, w)| matches!(w, Launched::Kernel(h) if handles.contains(h))).copied().collect();
            keys.into_iter()
                .filter_map(|k| {
                    let n = launches.remove(&k)?;
                    let Launched::Kernel(h) = k.1 else { return None };
                    let name = named.iter().find(|(x, _)| *x == h).map_or_else(|| Arc::from(format!("function {h:#x}").as_str()), |(_, n)| n.clone());
                    Some((k.0, name, n))
                })
                .collect()
        };
        let Some(mut retired) = lock(&p.retired) else { return };
        for (dev, name, n) in moved {
            *retired.entry((dev, name)).or_insert(0) += n;
        }
    }

    /// `function` was obtained from library kernel `kernel`: it has the kernel's name.
    pub fn remember_kernel_function(&self, function: *mut c_void, kernel: *mut c_void) {
        let Some(p) = self.placement() else { return };
        let known = lock(&p.names).and_then(|names| names.get(&(kernel as usize)).cloned());
        if let Some(entry) = known {
            self.retire(p, &[function as usize]);
            if let Some(mut names) = lock(&p.names) {
                names.insert(function as usize, entry);
            }
        }
    }

    /// The name of function (or library kernel) `f`: remembered, else asked of the driver
    /// (and remembered), else its handle.
    fn kernel_name(&self, p: &Placement, f: *mut c_void) -> Arc<str> {
        if let Some((name, _)) = lock(&p.names).and_then(|names| names.get(&(f as usize)).cloned()) {
            return name;
        }
        let api = self.api();
        let asked = [api.func_get_name, api.kernel_get_name].into_iter().flatten().find_map(|get| {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: a valid out-pointer; `f` is the handle the program launched with. The
            // driver answers with a string it keeps, or an error for a handle of the other kind.
            (!f.is_null() && unsafe { get(&mut name, f) } == CUDA_SUCCESS).then_some(name)
        });
        // SAFETY: the driver's answer is NULL or a NUL-terminated string.
        let name = asked.and_then(|n| unsafe { name_text(n) }).unwrap_or_else(|| Arc::from(format!("function {:#x}", f as usize).as_str()));
        if let Some(mut names) = lock(&p.names) {
            names.insert(f as usize, (name.clone(), 0));
        }
        name
    }

    /// Where program device `dev` is (asked of the driver and NVML; no lock held meanwhile).
    fn place_of(&self, dev: CUdevice) -> Place {
        if dev < 0 {
            return Place::default();
        }
        let part = self.program_devices().and_then(|d| d.get(dev)).and_then(|d| d.part).map(|p| (p.index, p.count));
        let uuid = self.driver_of(dev).and_then(|d| {
            let get = self.api().device_get_uuid?;
            let mut id = [0u8; 16];
            // SAFETY: a valid out-pointer; `d` is a driver ordinal.
            (unsafe { get(&mut id, d) } == CUDA_SUCCESS).then(|| crate::driver::uuid_string(&id))
        });
        // (NVML's list as read at start-up when the log is on: never loaded from a launch)
        let gpu_index = uuid.as_ref().and_then(|u| self.inventory_if_read()?.iter().position(|p| p.uuid.eq_ignore_ascii_case(u)));
        Place { gpu_index, uuid, part }
    }

    /// The description of `dev` for a line, remembered for the report.
    fn describe_device(&self, p: &Placement, dev: CUdevice) -> String {
        if let Some(text) = lock(&p.places).and_then(|places| Some(places.get(&dev)?.describe(dev))) {
            return text;
        }
        let place = self.place_of(dev);
        let text = place.describe(dev);
        if let Some(mut places) = lock(&p.places) {
            places.insert(dev, place);
        }
        text
    }

    /// A launch of function (or library kernel) `f` on `stream`.
    /// A launch into a stream being captured only adds a node to a graph: it is not counted
    /// (the graph's launches are).
    pub fn place_launch(&self, f: *mut c_void, stream: CUstream, per_thread: bool) {
        let Some(p) = self.placement() else { return };
        if self.capturing(stream) {
            return;
        }
        self.count_launch(p, Launched::Kernel(f as usize), stream, per_thread);
    }

    /// A launch of executable graph `exec` on `stream`.
    pub fn place_graph_launch(&self, exec: *mut c_void, stream: CUstream, per_thread: bool) {
        let Some(p) = self.placement() else { return };
        self.count_launch(p, Launched::Graph(exec as usize), stream, per_thread);
    }

    fn count_launch(&self, p: &Placement, what: Launched, stream: CUstream, per_thread: bool) {
        let dev = self.stream_device(stream).unwrap_or(-1);
        let first = {
            let Some(mut launches) = lock(&p.launches) else { return };
            let n = launches.entry((dev, what)).or_insert(0);
            *n += 1;
            *n == 1
        };
        if first {
            let what = match what {
                Launched::Kernel(f) => {
                    let name = self.kernel_name(p, f as *mut c_void);
                    if !lock(&p.printed).is_some_and(|mut printed| printed.insert((dev, name.clone()))) {
                        return;
                    }
                    format!("kernel {name}")
                }
                Launched::Graph(g) => format!("graph {g:#x}"),
            };
            line(&format!("{what} on {}, {}", self.describe_device(p, dev), stream_text(stream, per_thread)));
        }
    }

    /// A successful allocation of `bytes` through `what` on program device `dev` (`None`: the
    /// current context's), on `stream` for stream-ordered ones.
    #[inline]
    pub fn place_allocation(&self, what: &'static str, dev: Option<CUdevice>, bytes: u64, stream: Option<CUstream>) {
        if let Some(p) = self.placement() {
            self.count_allocation(p, what, dev, bytes, stream);
        }
    }

    #[cold]
    fn count_allocation(&self, p: &Placement, what: &'static str, dev: Option<CUdevice>, bytes: u64, stream: Option<CUstream>) {
        let dev = dev.or_else(|| self.current_device()).unwrap_or(-1);
        let first = {
            let Some(mut allocations) = lock(&p.allocations) else { return };
            let e = allocations.entry((dev, what)).or_insert((0, 0));
            e.0 += 1;
            e.1 = e.1.saturating_add(bytes);
            e.0 == 1
        };
        if first {
            let on = stream.map_or(String::new(), |s| format!(", {}", stream_text(s, false)));
            line(&format!("{what} of {bytes} bytes on {}{on}", self.describe_device(p, dev)));
        }
    }

    /// Every device's placement summary, by ordinal (`None` while the log is off).
    pub fn placement_summary(&self) -> Option<Vec<DeviceSummary>> {
        let p = self.placement()?;
        let mut by_device: std::collections::BTreeMap<CUdevice, DeviceSummary> = std::collections::BTreeMap::new();
        let places = lock(&p.places).map(|g| g.clone()).unwrap_or_default();
        fn entry<'a>(m: &'a mut std::collections::BTreeMap<CUdevice, DeviceSummary>, places: &HashMap<CUdevice, Place>, dev: CUdevice) -> &'a mut DeviceSummary {
            m.entry(dev).or_insert_with(|| DeviceSummary {
                ordinal: dev,
                place: places.get(&dev).cloned().unwrap_or_default(),
                kernels: Vec::new(),
                graphs: Vec::new(),
                allocations: Vec::new(),
            })
        }
        let launches: Vec<((CUdevice, Launched), u64)> = lock(&p.launches).map(|l| l.iter().map(|(k, n)| (*k, *n)).collect()).unwrap_or_default();
        let names = lock(&p.names).map(|g| g.clone()).unwrap_or_default();
        let retired: Vec<((CUdevice, Arc<str>), u64)> = lock(&p.retired).map(|r| r.iter().map(|(k, n)| (k.clone(), *n)).collect()).unwrap_or_default();
        let retired_graphs = lock(&p.retired_graphs).map(|g| g.clone()).unwrap_or_default();
        let by_name = launches
            .into_iter()
            .map(|((dev, what), n)| match what {
                Launched::Kernel(f) => (dev, Ok(names.get(&f).map_or_else(|| format!("function {f:#x}"), |(n, _)| n.to_string())), n),
                Launched::Graph(g) => (dev, Err(g), n),
            })
            .chain(retired.into_iter().map(|((dev, name), n)| (dev, Ok(name.to_string()), n)))
            .chain(retired_graphs.into_iter().map(|(dev, g, n)| (dev, Err(g), n)));
        for (dev, what, n) in by_name {
            match what {
                Ok(name) => {
                    // (handles of the same name — a module's function, a library's kernel — add up)
                    let kernels = &mut entry(&mut by_device, &places, dev).kernels;
                    match kernels.iter_mut().find(|(k, _)| *k == name) {
                        Some((_, count)) => *count += n,
                        None => kernels.push((name, n)),
                    }
                }
                Err(g) => entry(&mut by_device, &places, dev).graphs.push((g, n)),
            }
        }
        for ((dev, what), (n, bytes)) in lock(&p.allocations).map(|a| a.clone()).unwrap_or_default() {
            entry(&mut by_device, &places, dev).allocations.push((what, n, bytes));
        }
        let mut out: Vec<DeviceSummary> = by_device.into_values().collect();
        for d in &mut out {
            d.kernels.sort();
            d.graphs.sort();
            d.allocations.sort();
        }
        Some(out)
    }
}

/// One placement line (printed unless the log is off).
fn line(text: &str) {
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

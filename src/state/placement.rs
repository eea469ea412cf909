//! The state's side of the placement log: recording where each allocation and launch went.


use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;
use crate::driver::ffi::*;

use crate::placement::*;
use crate::state::State;

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
        let uuid = self.driver_of(dev).and_then(|d| self.api().device_uuid(d)).map(|id| crate::driver::uuid_string(&id));
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

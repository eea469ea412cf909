//! The exported functions called as C would call them. The init count is process-wide, so
//! every test that touches it holds `LOCK`; the device list is whatever the environment says
//! (2 devices of 16 GiB unless `GPUSIM_DEVICES` / `GPUSIM_MEMORY` are set).

use crate::api::*;
use crate::devices;
use crate::registry::count_of;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::ptr::{null, null_mut};
use std::sync::Mutex;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn handle(i: u32) -> nvmlDevice_t {
    let mut h = null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut h) },
        NVML_SUCCESS
    );
    h
}

fn text(buf: &[c_char]) -> String {
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn init_is_reference_counted() {
    let _g = lock();
    unsafe {
        let mut n = 0u32;
        // balance whatever other tests left (they always shut down what they start)
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        let mut h = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex(0, &mut h),
            NVML_ERROR_UNINITIALIZED
        );
        let mut v = [0 as c_char; 80];
        assert_eq!(
            nvmlSystemGetDriverVersion(v.as_mut_ptr(), 80),
            NVML_ERROR_UNINITIALIZED
        );
        // these need no init
        assert_eq!(nvmlSystemGetNVMLVersion(v.as_mut_ptr(), 80), NVML_SUCCESS);
        let mut cv = 0;
        assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut cv), NVML_SUCCESS);
        assert!(cv > 0);

        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(nvmlInitWithFlags(0), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n as usize, devices::all().len());
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }
}

#[test]
fn handles_and_identities() {
    let _g = lock();
    unsafe {
        assert_eq!(nvmlInit(), NVML_SUCCESS);
        let n = devices::all().len() as u32;
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount(&mut count), NVML_SUCCESS);
        assert_eq!(count, n);
        assert_eq!(nvmlDeviceGetCount(null_mut()), NVML_ERROR_INVALID_ARGUMENT);
        let mut h = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(n, &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        for i in 0..n {
            let h = handle(i);
            assert_eq!(h, handle(i), "stable handles");
            let mut idx = 99;
            assert_eq!(nvmlDeviceGetIndex(h, &mut idx), NVML_SUCCESS);
            assert_eq!(idx, i);
            let mut minor = 99;
            assert_eq!(nvmlDeviceGetMinorNumber(h, &mut minor), NVML_SUCCESS);
            assert_eq!(minor, i);

            let mut name = [0 as c_char; 96];
            assert_eq!(nvmlDeviceGetName(h, name.as_mut_ptr(), 96), NVML_SUCCESS);
            assert_eq!(text(&name), format!("gpusim device {i}"));
            assert_eq!(
                nvmlDeviceGetName(h, name.as_mut_ptr(), 4),
                NVML_ERROR_INSUFFICIENT_SIZE
            );

            let mut uuid = [0 as c_char; 96];
            assert_eq!(nvmlDeviceGetUUID(h, uuid.as_mut_ptr(), 96), NVML_SUCCESS);
            let u = text(&uuid);
            let b = 0x10 * (i + 1);
            assert!(
                u.starts_with(&format!("GPU-{:02x}{:02x}", b as u8, (b + 1) as u8)),
                "{u}"
            );
            assert_eq!(
                nvmlDeviceGetUUID(h, uuid.as_mut_ptr(), 40),
                NVML_ERROR_INSUFFICIENT_SIZE
            );
            assert_eq!(nvmlDeviceGetUUID(h, uuid.as_mut_ptr(), 41), NVML_SUCCESS);

            let mut by = null_mut();
            let cu = std::ffi::CString::new(u.to_uppercase().replace("GPU-", "gpu-")).unwrap();
            assert_eq!(
                nvmlDeviceGetHandleByUUID(cu.as_ptr(), &mut by),
                NVML_SUCCESS
            );
            assert_eq!(by, h);

            let mut v = nvmlUUID_v1_t {
                version: NVML_UUID_V1,
                type_: NVML_UUID_TYPE_BINARY,
                value: nvmlUUIDValue_t {
                    bytes: devices::all()[i as usize].uuid,
                },
            };
            let mut by = null_mut();
            assert_eq!(nvmlDeviceGetHandleByUUIDV(&v, &mut by), NVML_SUCCESS);
            assert_eq!(by, h);
            v.version = 1;
            assert_eq!(
                nvmlDeviceGetHandleByUUIDV(&v, &mut by),
                NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            );

            let mut serial = [0 as c_char; 30];
            assert_eq!(
                nvmlDeviceGetSerial(h, serial.as_mut_ptr(), 30),
                NVML_SUCCESS
            );
            assert_eq!(text(&serial), format!("GPUSIM-{i}"));
            let mut by = null_mut();
            assert_eq!(
                nvmlDeviceGetHandleBySerial(serial.as_ptr(), &mut by),
                NVML_SUCCESS
            );
            assert_eq!(by, h);

            let mut pci: nvmlPciInfo_t = std::mem::zeroed();
            assert_eq!(nvmlDeviceGetPciInfo_v3(h, &mut pci), NVML_SUCCESS);
            assert_eq!((pci.domain, pci.bus, pci.device), (0, b, 0));
            assert_eq!(text(&pci.busId), format!("00000000:{b:02X}:00.0"));
            assert_eq!(text(&pci.busIdLegacy), format!("0000:{b:02X}:00.0"));
            for id in [
                text(&pci.busId),
                text(&pci.busIdLegacy),
                text(&pci.busId).to_lowercase(),
            ] {
                let c = std::ffi::CString::new(id).unwrap();
                let mut by = null_mut();
                assert_eq!(
                    nvmlDeviceGetHandleByPciBusId_v2(c.as_ptr(), &mut by),
                    NVML_SUCCESS
                );
                assert_eq!(by, h);
                assert_eq!(
                    nvmlDeviceGetHandleByPciBusId(c.as_ptr(), &mut by),
                    NVML_SUCCESS
                );
                assert_eq!(by, h);
            }
            // v1/v2 write the 52-byte legacy layout only
            let mut pci2: nvmlPciInfo_t = std::mem::zeroed();
            pci2.busId[16] = 0x55;
            assert_eq!(nvmlDeviceGetPciInfo(h, &mut pci2), NVML_SUCCESS);
            assert_eq!(text(&pci2.busIdLegacy), format!("0000:{b:02X}:00.0"));
            assert_eq!(pci2.pciSubSystemId, pci.pciSubSystemId);
            assert_eq!(pci2.busId[16], 0x55);

            let mut ext: nvmlPciInfoExt_v1_t = std::mem::zeroed();
            assert_eq!(
                nvmlDeviceGetPciInfoExt(h, &mut ext),
                NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            );
            ext.version = NVML_PCI_INFO_EXT_V1;
            assert_eq!(nvmlDeviceGetPciInfoExt(h, &mut ext), NVML_SUCCESS);
            assert_eq!(text(&ext.busId), text(&pci.busId));

            let (mut ma, mut mi): (c_int, c_int) = (0, 0);
            assert_eq!(
                nvmlDeviceGetCudaComputeCapability(h, &mut ma, &mut mi),
                NVML_SUCCESS
            );
            assert_eq!((ma, mi), (9, 0));
            assert_eq!(
                nvmlDeviceGetCudaComputeCapability(h, &mut ma, null_mut()),
                NVML_ERROR_INVALID_ARGUMENT
            );
        }

        let mut by = null_mut();
        for bad in [
            c"GPU-1011",
            c"",
            c"GPU-10111213-1415-1617-1819-1a1b1c1d1e1f0",
        ] {
            assert_eq!(
                nvmlDeviceGetHandleByUUID(bad.as_ptr(), &mut by),
                NVML_ERROR_NOT_FOUND
            );
        }
        assert_eq!(
            nvmlDeviceGetHandleByUUID(null(), &mut by),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleBySerial(c"GPUSIM-99".as_ptr(), &mut by),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:ff:00.0".as_ptr(), &mut by),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"what".as_ptr(), &mut by),
            NVML_ERROR_INVALID_ARGUMENT
        );

        // a pointer that is no handle is never dereferenced
        let mut x = 0u32;
        let fake = &mut x as *mut u32 as nvmlDevice_t;
        let mut idx = 0;
        assert_eq!(
            nvmlDeviceGetIndex(fake, &mut idx),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetIndex(null_mut(), &mut idx),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetIndex(handle(0), null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

#[test]
fn memory_and_state() {
    let _g = lock();
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        let h = handle(0);
        let total = devices::all()[0].total;
        let mut m = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(h, &mut m), NVML_SUCCESS);
        assert_eq!(
            m,
            nvmlMemory_t {
                total,
                free: total,
                used: 0
            }
        );
        assert_eq!(
            nvmlDeviceGetMemoryInfo(h, null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        let mut m2 = nvmlMemory_v2_t::default();
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(h, &mut m2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        m2.version = 0x0200_0028;
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(h, &mut m2), NVML_SUCCESS);
        assert_eq!(
            m2,
            nvmlMemory_v2_t {
                version: 0x0200_0028,
                total,
                reserved: 0,
                free: total,
                used: 0
            }
        );

        let mut bar1 = nvmlBAR1Memory_t::default();
        assert_eq!(nvmlDeviceGetBAR1MemoryInfo(h, &mut bar1), NVML_SUCCESS);
        assert_eq!(bar1.bar1Total, bar1.bar1Free + bar1.bar1Used);

        let mut u = 7;
        assert_eq!(nvmlDeviceGetComputeMode(h, &mut u), NVML_SUCCESS);
        assert_eq!(u, 0);
        assert_eq!(nvmlDeviceGetPersistenceMode(h, &mut u), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetBrand(h, &mut u), NVML_SUCCESS);
        assert_eq!(u, 14);
        assert_eq!(nvmlDeviceGetArchitecture(h, &mut u), NVML_SUCCESS);
        assert_eq!(u, 9);
        assert_eq!(nvmlDeviceGetTemperature(h, 0, &mut u), NVML_SUCCESS);
        assert_eq!(u, 40);
        assert_eq!(
            nvmlDeviceGetTemperature(h, 1, &mut u),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetPowerUsage(h, &mut u), NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetClockInfo(h, 1, &mut u), NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetMaxClockInfo(h, 4, &mut u),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let mut util = nvmlUtilization_t { gpu: 5, memory: 5 };
        assert_eq!(nvmlDeviceGetUtilizationRates(h, &mut util), NVML_SUCCESS);
        assert_eq!(util, nvmlUtilization_t::default());
        let (mut cur, mut pend) = (0, 0);
        assert_eq!(
            nvmlDeviceGetMigMode(h, &mut cur, &mut pend),
            NVML_ERROR_NOT_SUPPORTED
        );

        let mut c: c_uint = 5;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(h, &mut c, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(c, 0);
        c = 5;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses(h, &mut c, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(c, 0);
        assert_eq!(
            nvmlDeviceGetGraphicsRunningProcesses_v3(h, null_mut(), null_mut()),
            NVML_ERROR_INVALID_ARGUMENT
        );

        let mut v = [0 as c_char; 80];
        assert_eq!(nvmlSystemGetDriverVersion(v.as_mut_ptr(), 80), NVML_SUCCESS);
        assert_eq!(text(&v), DRIVER_VERSION);
        assert_eq!(
            nvmlSystemGetDriverVersion(v.as_mut_ptr(), 3),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

#[test]
fn topology() {
    let _g = lock();
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        if devices::all().len() >= 2 {
            let (a, b) = (handle(0), handle(1));
            let mut s = 9;
            assert_eq!(nvmlDeviceGetP2PStatus(a, b, 0, &mut s), NVML_SUCCESS);
            assert_eq!(s, NVML_P2P_STATUS_OK);
            assert_eq!(nvmlDeviceGetP2PStatus(a, a, 0, &mut s), NVML_SUCCESS);
            assert_eq!(s, NVML_P2P_STATUS_NOT_SUPPORTED);
            assert_eq!(
                nvmlDeviceGetP2PStatus(a, b, 9, &mut s),
                NVML_ERROR_INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetTopologyCommonAncestor(a, b, &mut s),
                NVML_SUCCESS
            );
            assert_eq!(s, NVML_TOPOLOGY_HOSTBRIDGE);
            let mut same = 9;
            assert_eq!(nvmlDeviceOnSameBoard(a, b, &mut same), NVML_SUCCESS);
            assert_eq!(same, 0);
            assert_eq!(
                nvmlDeviceOnSameBoard(a, null_mut(), &mut same),
                NVML_ERROR_INVALID_ARGUMENT
            );
        }
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

#[test]
fn error_strings_and_counts() {
    let s = |r| {
        unsafe { CStr::from_ptr(nvmlErrorString(r)) }
            .to_str()
            .unwrap()
    };
    assert_eq!(s(0), "Success");
    assert_eq!(s(1), "Uninitialized");
    assert_eq!(s(25), "Argument version mismatch");
    assert_eq!(s(999), "Unknown Error");
    assert_eq!(s(-5), "Unknown Error");
    assert!(count_of("nvmlErrorString") >= 5);
    let mut cv = 0;
    let before = count_of("nvmlSystemGetCudaDriverVersion");
    assert_eq!(
        unsafe { nvmlSystemGetCudaDriverVersion(&mut cv) },
        NVML_SUCCESS
    );
    assert_eq!(
        unsafe { nvmlSystemGetCudaDriverVersion(null_mut()) },
        NVML_ERROR_INVALID_ARGUMENT
    );
    assert!(count_of("nvmlSystemGetCudaDriverVersion") >= before + 2);
}

#[test]
fn internal_export_table_has_the_535_layout() {
    use crate::internal::{NULL_SLOTS, SLOTS, SLOT_HANDLE_BY_INDEX, TABLE_ID};
    use std::ffi::c_void;
    let _g = lock();
    unsafe {
        let mut t: *const c_void = null();
        // no nvmlInit needed; a wrong id or NULL arguments are INVALID_ARGUMENT
        assert_eq!(nvmlInternalGetExportTable(&mut t, TABLE_ID.as_ptr().cast()), NVML_SUCCESS);
        assert_eq!(nvmlInternalGetExportTable(&mut t, [0u8; 16].as_ptr().cast()), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(nvmlInternalGetExportTable(null_mut(), TABLE_ID.as_ptr().cast()), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(nvmlInternalGetExportTable(&mut t, null()), NVML_ERROR_INVALID_ARGUMENT);
        let slots = std::slice::from_raw_parts(t.cast::<usize>(), SLOTS);
        assert_eq!(slots[0], 1960);
        for (i, &s) in slots.iter().enumerate().skip(1) {
            assert_eq!(s == 0, NULL_SLOTS.contains(&i), "slot {i}");
        }
        type F = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> nvmlReturn_t;
        let f = |i: usize| std::mem::transmute::<usize, F>(slots[i]);
        // an unknown slot: NOT_SUPPORTED; slot 81: the handle by index (after nvmlInit)
        assert_eq!(f(26)(0, 0, 0, 0, 0, 0), NVML_ERROR_NOT_SUPPORTED);
        let mut h: nvmlDevice_t = null_mut();
        let out = &mut h as *mut nvmlDevice_t as usize;
        assert_eq!(f(SLOT_HANDLE_BY_INDEX)(1, out, 0x22, 0, 0, 0), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        assert_eq!(f(SLOT_HANDLE_BY_INDEX)(1, out, 0x22, 0, 0, 0), NVML_SUCCESS);
        assert_eq!(h, handle(1));
        let n = devices::all().len();
        assert_eq!(f(SLOT_HANDLE_BY_INDEX)(n, out, 0x22, 0, 0, 0), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(f(SLOT_HANDLE_BY_INDEX)(0, 0, 0x22, 0, 0, 0), NVML_ERROR_INVALID_ARGUMENT);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

#[test]
fn event_sets_and_unsupported_queries() {
    use std::ffi::c_void;
    let _g = lock();
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        let mut set: *mut c_void = null_mut();
        assert_eq!(nvmlEventSetCreate(&mut set), NVML_SUCCESS);
        let mut types = 7u64;
        assert_eq!(nvmlDeviceGetSupportedEventTypes(handle(0), &mut types), NVML_SUCCESS);
        assert_eq!(types, 0);
        assert_eq!(nvmlDeviceRegisterEvents(handle(0), 1, set), NVML_ERROR_NOT_SUPPORTED);
        let mut data = [0u8; 64];
        assert_eq!(nvmlEventSetWait_v2(set, data.as_mut_ptr().cast(), 10), NVML_ERROR_TIMEOUT);
        assert_eq!(nvmlEventSetFree(set), NVML_SUCCESS);
        assert_eq!(nvmlEventSetFree(set), NVML_ERROR_INVALID_ARGUMENT);
        let mut v = 0u32;
        assert_eq!(nvmlDeviceGetFanSpeed(handle(0), &mut v), NVML_ERROR_NOT_SUPPORTED);
        assert_eq!(nvmlDeviceGetFanSpeed(null_mut(), &mut v), NVML_ERROR_INVALID_ARGUMENT);
        v = 5;
        assert_eq!(nvmlDeviceIsMigDeviceHandle(handle(0), &mut v), NVML_SUCCESS);
        assert_eq!(v, 0);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

/// Utilisation from the node state's time region (a file written here as the simulated driver
/// lays it out): the device's % of the last second and one sample per process.
#[test]
fn utilisation_from_the_node_state() {
    use gpusim_common::busy;
    use std::os::unix::fs::OpenOptionsExt;
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("gpusim-nvml-util-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("node");
    let mut file = vec![0u8; busy::TIME_OFF + busy::TIME_SIZE];
    file[0..8].copy_from_slice(b"gpusimND");
    file[8..12].copy_from_slice(&2u32.to_le_bytes());
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    let cur = busy::epoch(now);
    let mut put = |off: usize, v: u64| file[off..off + 8].copy_from_slice(&v.to_le_bytes());
    let dev1 = busy::dev_off(1) + busy::DEV_HEADER;
    // pid 4242: 5 full buckets of the last 10 (50 %); pid 4343: 2 half buckets (10 %)
    put(dev1, 4242);
    for k in 1..=5 {
        let e = cur - k;
        put(dev1 + 16 + 8 * (e as usize % busy::NBUCKETS), busy::pack(e, busy::BUCKET_NS));
    }
    put(dev1 + busy::ENTRY_SIZE, 4343);
    for k in [3, 9] {
        let e = cur - k;
        put(dev1 + busy::ENTRY_SIZE + 16 + 8 * (e as usize % busy::NBUCKETS), busy::pack(e, busy::BUCKET_NS / 2));
    }
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path).unwrap();
    std::fs::write(&path, &file).unwrap();
    std::env::set_var("GPUSIM_NODE_STATE", &path);
    struct Restore(std::path::PathBuf);
    impl Drop for Restore {
        fn drop(&mut self) {
            std::env::remove_var("GPUSIM_NODE_STATE");
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _r = Restore(dir);
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        // (the buckets above may have left the window if the clock crossed a bucket boundary
        // meanwhile: then at most one bucket less; the figures are checked on that basis)
        let mut util = nvmlUtilization_t::default();
        assert_eq!(nvmlDeviceGetUtilizationRates(handle(1), &mut util), NVML_SUCCESS);
        assert!((50..=60).contains(&util.gpu), "{util:?}");
        assert_eq!(util.memory, 0);
        let mut other = nvmlUtilization_t { gpu: 9, memory: 9 };
        assert_eq!(nvmlDeviceGetUtilizationRates(handle(0), &mut other), NVML_SUCCESS);
        assert_eq!(other, nvmlUtilization_t::default());
        // the size protocol
        let mut n: c_uint = 0;
        assert_eq!(nvmlDeviceGetProcessUtilization(handle(1), null_mut(), &mut n, 0), NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(n, 2);
        let mut samples = [nvmlProcessUtilizationSample_t::default(); 4];
        n = 1;
        assert_eq!(nvmlDeviceGetProcessUtilization(handle(1), samples.as_mut_ptr(), &mut n, 0), NVML_ERROR_INSUFFICIENT_SIZE);
        assert_eq!(n, 2);
        n = 4;
        assert_eq!(nvmlDeviceGetProcessUtilization(handle(1), samples.as_mut_ptr(), &mut n, 0), NVML_SUCCESS);
        assert_eq!(n, 2);
        assert_eq!((samples[0].pid, samples[1].pid), (4242, 4343));
        assert!((40..=50).contains(&samples[0].smUtil), "{samples:?}");
        assert!((5..=10).contains(&samples[1].smUtil), "{samples:?}");
        assert!(samples[0].timeStamp > 1_600_000_000_000_000, "CLOCK_REALTIME µs");
        assert_eq!((samples[0].memUtil, samples[0].encUtil, samples[0].decUtil), (0, 0, 0));
        // nothing newer than a future lastSeen; no process on device 0
        n = 4;
        assert_eq!(nvmlDeviceGetProcessUtilization(handle(1), samples.as_mut_ptr(), &mut n, u64::MAX), NVML_ERROR_NOT_FOUND);
        assert_eq!(n, 0);
        n = 4;
        assert_eq!(nvmlDeviceGetProcessUtilization(handle(0), samples.as_mut_ptr(), &mut n, 0), NVML_ERROR_NOT_FOUND);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

/// `GPUSIM_LOST`: a device listed there answers `NVML_ERROR_GPU_IS_LOST` for a new handle and
/// through an old one, the count is unchanged, the other device is untouched; removed from the
/// file, it answers again.
#[test]
fn a_lost_gpu_answers_gpu_is_lost() {
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("gpusim-nvml-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lost");
    std::env::set_var("GPUSIM_LOST", &path);
    struct Restore(std::path::PathBuf);
    impl Drop for Restore {
        fn drop(&mut self) {
            std::env::remove_var("GPUSIM_LOST");
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _r = Restore(dir);
    unsafe {
        assert_eq!(nvmlInit_v2(), NVML_SUCCESS);
        let old = handle(1);
        std::fs::write(&path, "1\n").unwrap();
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_SUCCESS);
        assert_eq!(count, devices::all().len() as c_uint);
        let mut h = null_mut();
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut h), NVML_ERROR_GPU_IS_LOST);
        let mut m = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(old, &mut m), NVML_ERROR_GPU_IS_LOST);
        assert_eq!(nvmlDeviceGetMemoryInfo(handle(0), &mut m), NVML_SUCCESS);
        std::fs::write(&path, "").unwrap();
        assert_eq!(nvmlDeviceGetMemoryInfo(old, &mut m), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
    }
}

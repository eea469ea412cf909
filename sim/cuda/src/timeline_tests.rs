//! Tests of simulated time: serial execution, events, stream synchronisation, host functions,
//! the queue depth, graphs, the busy record, the device's time slices between the processes of
//! a node, utilisation.
//! Lower bounds are exact (the model guarantees them); upper bounds are loose (2 loaded cores).

use super::*;
use crate::context::*;
use crate::graphs::*;
use crate::kernels::*;
use crate::streams::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;
const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry gpusim_busy(.param .u64 ns)\n{ ret; }\n.visible .entry plain(.param .u64 x)\n{ ret; }\n\0";

struct Setup {
    busy: CUfunction,
    plain: CUfunction,
    _g: std::sync::MutexGuard<'static, ()>,
}

fn setup() -> Setup {
    let g = crate::DRIVER_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    unsafe {
        assert_eq!(crate::devices::cuInit(0), CUDA_SUCCESS);
        let mut ctx: CUcontext = std::ptr::null_mut();
        assert_eq!(cuCtxCreate_v2(&mut ctx, 0, 0), CUDA_SUCCESS);
        let mut m: CUmodule = std::ptr::null_mut();
        assert_eq!(cuModuleLoadData(&mut m, PTX.as_ptr().cast()), CUDA_SUCCESS);
        let (mut busy, mut plain): (CUfunction, CUfunction) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(cuModuleGetFunction(&mut busy, m, c"gpusim_busy".as_ptr()), CUDA_SUCCESS);
        assert_eq!(cuModuleGetFunction(&mut plain, m, c"plain".as_ptr()), CUDA_SUCCESS);
        Setup { busy, plain, _g: g }
    }
}

fn stream() -> CUstream {
    let mut s: CUstream = std::ptr::null_mut();
    assert_eq!(unsafe { cuStreamCreate(&mut s, 1) }, CUDA_SUCCESS);
    s
}

fn event(flags: u32) -> CUevent {
    let mut e: CUevent = std::ptr::null_mut();
    assert_eq!(unsafe { cuEventCreate(&mut e, flags) }, CUDA_SUCCESS);
    e
}

/// Launches `f` on `s` with its first parameter `ns`.
fn launch(f: CUfunction, s: CUstream, ns: u64) -> CUresult {
    let mut v = ns;
    let mut params = [&mut v as *mut u64 as *mut c_void];
    unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut()) }
}

fn elapsed_ms(a: CUevent, b: CUevent) -> f32 {
    let mut ms = -1.0f32;
    assert_eq!(unsafe { cuEventElapsedTime(&mut ms, a, b) }, CUDA_SUCCESS);
    ms
}

#[test]
fn kernels_run_one_after_another_on_a_device() {
    let t = setup();
    let (s1, s2) = (stream(), stream());
    let (e0, e1) = (event(0), event(0));
    let wall = Instant::now();
    unsafe {
        assert_eq!(cuEventRecord(e0, s1), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, s1, 50 * MS), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, s2, 50 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(e1, s2), CUDA_SUCCESS);
        // launches do not wait: the work is still pending (unless this thread stalled 100 ms)
        assert_eq!(cuStreamQuery(s2), CUDA_ERROR_NOT_READY);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
    assert!(wall.elapsed() >= Duration::from_millis(100));
    let ms = elapsed_ms(e0, e1);
    assert!((100.0..400.0).contains(&ms), "{ms} ms");
    // a plain kernel takes GPUSIM_KERNEL_NS (0 here): nothing waits
    unsafe { assert_eq!(cuEventRecord(e0, s1), CUDA_SUCCESS) };
    assert_eq!(launch(t.plain, s1, 50 * MS), CUDA_SUCCESS);
    unsafe {
        assert_eq!(cuEventRecord(e1, s1), CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(s1), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(e1), CUDA_SUCCESS);
    }
    assert!(elapsed_ms(e0, e1) < 5.0);
}

#[test]
fn events_are_stamped_when_their_stream_reaches_them() {
    let t = setup();
    let (s1, s2) = (stream(), stream());
    let (a, b, c, untimed, never) = (event(0), event(0), event(0), event(2), event(0));
    unsafe {
        // never recorded: complete, but no time
        assert_eq!(cuEventQuery(never), CUDA_SUCCESS);
        assert_eq!(cuEventSynchronize(never), CUDA_SUCCESS);
        let mut ms = 0f32;
        assert_eq!(cuEventElapsedTime(&mut ms, never, never), CUDA_ERROR_INVALID_HANDLE);
        let before = Instant::now();
        assert_eq!(cuEventRecord(a, s1), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, s1, 200 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, s1), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(untimed, s1), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(b), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventElapsedTime(&mut ms, a, b), CUDA_ERROR_NOT_READY);
        // s2 waits for b: its next mark comes after it
        assert_eq!(cuStreamWaitEvent(s2, b, 0), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(c, s2), CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(s2), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventSynchronize(b), CUDA_SUCCESS);
        assert!(before.elapsed() >= Duration::from_millis(200));
        assert_eq!(cuEventQuery(b), CUDA_SUCCESS);
        assert_eq!(cuEventElapsedTime(&mut ms, a, untimed), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventElapsedTime_v2(&mut ms, a, untimed), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS);
    }
    let ab = elapsed_ms(a, b);
    assert!((200.0..600.0).contains(&ab), "{ab}");
    assert!(elapsed_ms(b, c) >= 0.0);
    assert!(elapsed_ms(a, c) >= 200.0);
    assert!(elapsed_ms(b, a) <= -200.0, "negative when reversed");
}

#[test]
fn stream_synchronize_waits_for_its_work() {
    let t = setup();
    let s = stream();
    let wall = Instant::now();
    assert_eq!(launch(t.busy, s, 200 * MS), CUDA_SUCCESS);
    unsafe {
        assert_eq!(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
        assert!(wall.elapsed() >= Duration::from_millis(200));
        assert!(wall.elapsed() < Duration::from_secs(3));
        assert_eq!(cuStreamQuery(s), CUDA_SUCCESS);
        // the legacy stream waits for blocking streams: a created blocking stream's kernel
        // delays the NULL stream's event
        let mut blocking: CUstream = std::ptr::null_mut();
        assert_eq!(cuStreamCreate(&mut blocking, 0), CUDA_SUCCESS);
        let (a, b) = (event(0), event(0));
        assert_eq!(cuEventRecord(a, blocking), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, blocking, 40 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, std::ptr::null_mut()), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(std::ptr::null_mut()), CUDA_SUCCESS);
        assert!(elapsed_ms(a, b) >= 40.0);
        // a synchronous copy waits for the legacy stream's work
        let wall = Instant::now();
        assert_eq!(launch(t.busy, std::ptr::null_mut(), 40 * MS), CUDA_SUCCESS);
        let (mut x, y) = (0u64, 7u64);
        assert_eq!(crate::memory::cuMemcpy(&mut x as *mut u64 as CUdeviceptr, &y as *const u64 as CUdeviceptr, 8), CUDA_SUCCESS);
        assert!(wall.elapsed() >= Duration::from_millis(40));
        assert_eq!(x, 7);
    }
}

static ORDER: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

unsafe extern "C" fn note(data: *mut c_void) {
    ORDER.lock().unwrap().push((data as u64, now()));
}

unsafe extern "C" fn note_cb(_s: CUstream, status: CUresult, data: *mut c_void) {
    assert_eq!(status, CUDA_SUCCESS);
    ORDER.lock().unwrap().push((data as u64, now()));
}

#[test]
fn host_functions_run_in_stream_order_when_reached() {
    let t = setup();
    ORDER.lock().unwrap().clear();
    let (s1, s2) = (stream(), stream());
    let t0 = now();
    unsafe {
        assert_eq!(launch(t.busy, s1, 200 * MS), CUDA_SUCCESS);
        assert_eq!(cuLaunchHostFunc(s1, Some(note), 1 as *mut c_void), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, s1, 30 * MS), CUDA_SUCCESS);
        assert_eq!(cuStreamAddCallback(s1, Some(note_cb), 2 as *mut c_void, 0), CUDA_SUCCESS);
        // s2 has nothing pending: its function runs at once (on the worker)
        assert_eq!(cuLaunchHostFunc(s2, Some(note), 3 as *mut c_void), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS);
        let early: Vec<(u64, i64)> = ORDER.lock().unwrap().iter().map(|o| (o.0, o.1 as i64 - t0 as i64)).collect();
        assert_eq!(early.iter().map(|o| o.0).collect::<Vec<_>>(), vec![3], "{early:?}");
        assert_eq!(cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
        assert_eq!(cuStreamSynchronize(s1), CUDA_SUCCESS);
    }
    let order = ORDER.lock().unwrap().clone();
    assert_eq!(order.iter().map(|o| o.0).collect::<Vec<_>>(), vec![3, 1, 2]);
    assert!(order[1].1 >= t0 + 200 * MS, "ran when the stream reached it");
    assert!(order[2].1 >= t0 + 230 * MS);
    assert!(order[1].1 < t0 + 3000 * MS);
}

#[test]
fn a_full_queue_blocks_the_launching_thread() {
    let t = setup();
    set_queue_depth(2);
    let s = stream();
    let wall = Instant::now();
    for _ in 0..4 {
        assert_eq!(launch(t.busy, s, 30 * MS), CUDA_SUCCESS);
    }
    // the 3rd launch waits for the 1st kernel's end, the 4th for the 2nd's
    let waited = wall.elapsed();
    set_queue_depth(1024);
    assert!(waited >= Duration::from_millis(60), "{waited:?}");
    assert!(waited < Duration::from_secs(3));
    unsafe { assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS) };
    assert!(wall.elapsed() >= Duration::from_millis(120));
}

#[test]
fn graphs_take_the_sum_of_their_kernel_nodes() {
    let t = setup();
    let s = stream();
    unsafe {
        // captured
        assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
        for _ in 0..3 {
            assert_eq!(launch(t.busy, s, 20 * MS), CUDA_SUCCESS);
        }
        let mut g: CUgraph = std::ptr::null_mut();
        assert_eq!(cuStreamEndCapture(s, &mut g), CUDA_SUCCESS);
        // and one added explicitly (CUDA_KERNEL_NODE_PARAMS, v1: 56 bytes)
        let mut v = 25 * MS;
        let mut kp = [&mut v as *mut u64 as *mut c_void];
        let mut params = [0u8; 56];
        params[0..8].copy_from_slice(&(t.busy as usize).to_le_bytes());
        params[40..48].copy_from_slice(&(kp.as_mut_ptr() as usize).to_le_bytes());
        let mut n: CUgraphNode = std::ptr::null_mut();
        assert_eq!(cuGraphAddKernelNode(&mut n, g, std::ptr::null(), 0, params.as_ptr()), CUDA_SUCCESS);
        let mut kind = -1;
        assert_eq!(cuGraphNodeGetType(n, &mut kind), CUDA_SUCCESS);
        assert_eq!(kind, 0);
        let mut exec: CUgraphExec = std::ptr::null_mut();
        assert_eq!(cuGraphInstantiateWithFlags(&mut exec, g, 0), CUDA_SUCCESS);
        let (a, b) = (event(0), event(0));
        assert_eq!(cuEventRecord(a, s), CUDA_SUCCESS);
        assert_eq!(cuGraphLaunch(exec, s), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, s), CUDA_SUCCESS);
        assert_eq!(cuEventSynchronize(b), CUDA_SUCCESS);
        let ms = elapsed_ms(a, b);
        assert!((85.0..400.0).contains(&ms), "{ms}");
    }
}

fn busy_of(json: &str, p: usize) -> Option<(u64, Vec<u64>)> {
    let at = json.find(&format!("{{\"device\":{p},\"busy_ns\":"))?;
    let rest = &json[at..];
    let num = |key: &str| -> u64 {
        let i = rest.find(key).unwrap() + key.len();
        rest[i..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
    };
    let i = rest.find("\"buckets\":[").unwrap() + "\"buckets\":[".len();
    let list = &rest[i..i + rest[i..].find(']').unwrap()];
    let buckets = list.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect();
    Some((num("\"busy_ns\":"), buckets))
}

#[test]
fn busy_time_is_recorded_in_10ms_buckets() {
    let t = setup();
    let s = stream();
    let before = busy_of(&busy_json(), 0).unwrap_or((0, Vec::new()));
    assert_eq!(launch(t.busy, s, 25 * MS), CUDA_SUCCESS);
    assert_eq!(launch(t.busy, s, 5 * MS), CUDA_SUCCESS);
    let after = busy_of(&busy_json(), 0).expect("device 0 in the busy report");
    assert_eq!(after.0 - before.0, 30 * MS);
    let sum = |b: &[u64]| b.iter().sum::<u64>();
    assert_eq!(sum(&after.1) - sum(&before.1), 30 * MS);
    assert!(after.1.iter().all(|&n| n <= BUCKET_NS));
    let changed = after.1.iter().enumerate().filter(|(i, n)| before.1.get(*i) != Some(n)).count();
    assert!(changed >= 3, "30 ms span at least 3 buckets of 10 ms");
    assert!(crate::stats::report_json().contains("\"busy\":[{\"device\":0,"));
    unsafe { assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS) };
}

/// Forks a child running `f`, which writes a u64 to a pipe: (its pid, the pipe's read end).
fn fork_child(f: impl FnOnce() -> u64) -> (i32, i32) {
    let mut fds = [0i32; 2];
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            libc::close(fds[0]);
            let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(0);
            libc::write(fds[1], (&v as *const u64).cast(), 8);
            libc::_exit(0);
        }
        libc::close(fds[1]);
        (pid, fds[0])
    }
}

/// What the child of `fork_child` wrote, once it has exited.
fn join_child((pid, fd): (i32, i32)) -> u64 {
    let mut v = 0u64;
    unsafe {
        let n = libc::read(fd, (&mut v as *mut u64).cast(), 8);
        libc::close(fd);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        assert_eq!(n, 8);
    }
    v
}

/// Forks a child running `f`, which writes a u64 to the pipe; returns it.
fn in_child(f: impl FnOnce() -> u64) -> u64 {
    join_child(fork_child(f))
}

/// Node state on for the test (a file of its own), off again when dropped.
struct NodeOn(String);

impl NodeOn {
    fn new(name: &str) -> NodeOn {
        let path = crate::node::tests::temp_path(name);
        let totals = vec![16u64 << 30; crate::devices::physical().len()];
        crate::node::install_for_test(Some(crate::node::Node::attach(&path, &totals).unwrap()));
        NodeOn(path)
    }
}

impl Drop for NodeOn {
    fn drop(&mut self) {
        crate::node::install_for_test(None);
        let _ = std::fs::remove_dir_all(std::path::Path::new(&self.0).parent().unwrap());
    }
}

#[test]
fn processes_of_a_node_take_turns_on_the_device_and_share_utilisation() {
    let t = setup();
    let _node = NodeOn::new("time");
    let s = stream();
    unsafe { assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS) };
    // a child submits 300 ms of work on device 0 and exits at once (its kernel "runs" on)
    let busy = t.busy;
    let sent = in_child(move || {
        let before = now();
        let mut v = 300 * MS;
        let mut params = [&mut v as *mut u64 as *mut c_void];
        let s: CUstream = std::ptr::null_mut();
        let rc = unsafe { cuLaunchKernel(busy, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut()) };
        if rc == CUDA_SUCCESS { before } else { 0 }
    });
    assert_ne!(sent, 0, "the child launched");
    // our own kernel starts after the child's (a kernel runs to its end once started): the
    // device is shared; the events around it measure our kernel alone
    let (e0, e1) = (event(0), event(0));
    unsafe {
        assert_eq!(cuEventRecord(e0, s), CUDA_SUCCESS);
        assert_eq!(launch(busy, s, 10 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(e1, s), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventSynchronize(e1), CUDA_SUCCESS);
    }
    assert!(now() >= sent + 310 * MS);
    let ms = elapsed_ms(e0, e1);
    assert!((9.9..11.0).contains(&ms), "{ms} ms");
    // utilisation: the child's 300 ms lie in the last second once its buckets are complete
    let end = sent + 310 * MS;
    sleep_until(0, (busy::epoch(end) + 1) * busy::BUCKET_NS + MS, || true);
    let node = crate::node::active().unwrap();
    let block: Vec<u8> = (0..busy::DEV_SIZE / 8).flat_map(|i| node.time_word(0, i).unwrap().load(Ordering::Acquire).to_le_bytes()).collect();
    let (gpu, procs) = busy::utilisation(&block, now());
    // (the child's 300 ms and our 10 ms)
    assert_eq!(procs.len(), 2, "{procs:?}");
    let child = procs.iter().find(|p| p.0 != std::process::id()).expect("the child's entry");
    let ours = procs.iter().find(|p| p.0 == std::process::id()).expect("our entry");
    assert!((29..=31).contains(&child.1), "{procs:?}");
    assert!(ours.1 <= 2, "{procs:?}");
    assert!((30..=32).contains(&gpu), "{gpu} {procs:?}");
}

/// Queues 40 kernels of 1 ms on the NULL stream, with events around the first and around all,
/// and waits for them: (ms of the first, ms of all).
fn forty(busy: CUfunction) -> (f32, f32) {
    let s: CUstream = std::ptr::null_mut();
    let (a, b, c) = (event(0), event(0), event(0));
    unsafe {
        assert_eq!(cuEventRecord(a, s), CUDA_SUCCESS);
        assert_eq!(launch(busy, s, MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, s), CUDA_SUCCESS);
        for _ in 1..40 {
            assert_eq!(launch(busy, s, MS), CUDA_SUCCESS);
        }
        assert_eq!(cuEventRecord(c, s), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
    (elapsed_ms(a, b), elapsed_ms(a, c))
}

#[test]
fn two_processes_with_work_queued_share_the_device_by_time_slices() {
    let t = setup();
    let _node = NodeOn::new("slices");
    let busy = t.busy;
    let s: CUstream = std::ptr::null_mut();
    unsafe { assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS) };
    // a 150 ms kernel of ours holds the device while a child and we queue 40 ms of work each;
    // when it ends, the device alternates between the two every 2 ms slice, each switch
    // costing 0.2 ms (`GPUSIM_SWITCH_NS`): each one's 40 kernels take about 88 ms (on devices of
    // their own: 40; one after the other: 40 and 80; free switches: 80), and each kernel alone
    // still measures 1 ms
    assert_eq!(launch(busy, s, 150 * MS), CUDA_SUCCESS);
    let child = fork_child(move || {
        let (first, all) = forty(busy);
        ((first * 1000.0) as u64) << 32 | (all * 1000.0) as u64
    });
    let ours = forty(busy);
    let w = join_child(child);
    let theirs = ((w >> 32) as f32 / 1000.0, (w & 0xffff_ffff) as f32 / 1000.0);
    for (who, (first, all)) in [("ours", ours), ("the child's", theirs)] {
        assert!((0.99..1.05).contains(&first), "{who}: the first kernel took {first} ms ({ours:?} {theirs:?})");
        assert!((83.0..=93.0).contains(&all), "{who}: 40 ms of work took {all} ms ({ours:?} {theirs:?})");
    }
}

static WHEN: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

unsafe extern "C" fn when(data: *mut c_void) {
    WHEN.lock().unwrap().push((data as u64, now()));
}

#[test]
fn blocking_streams_wait_for_the_legacy_stream_non_blocking_ones_do_not() {
    let t = setup();
    WHEN.lock().unwrap().clear();
    let nonblocking = stream();
    let mut blocking: CUstream = std::ptr::null_mut();
    unsafe { assert_eq!(cuStreamCreate(&mut blocking, 0), CUDA_SUCCESS) };
    let t0 = now();
    assert_eq!(launch(t.busy, std::ptr::null_mut(), 200 * MS), CUDA_SUCCESS);
    unsafe {
        assert_eq!(cuLaunchHostFunc(nonblocking, Some(when), 1 as *mut c_void), CUDA_SUCCESS);
        assert_eq!(cuLaunchHostFunc(blocking, Some(when), 2 as *mut c_void), CUDA_SUCCESS);
        // the per-thread default stream (NULL in a _ptsz call) is blocking too
        assert_eq!(cuLaunchHostFunc_ptsz(std::ptr::null_mut(), Some(when), 3 as *mut c_void), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(nonblocking), CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
    let w = WHEN.lock().unwrap().clone();
    assert_eq!(w.len(), 3, "{w:?}");
    let at = |k: u64| w.iter().find(|x| x.0 == k).unwrap().1;
    // the non-blocking stream's function was due at once, so it ran first (the worker runs the
    // earliest due first), and before the legacy kernel's end under any load but an extreme one
    assert_eq!(w[0].0, 1, "{w:?}");
    assert!(at(1) < t0 + 2000 * MS);
    assert!(at(2) >= t0 + 200 * MS);
    assert!(at(3) >= t0 + 200 * MS);
}

#[test]
fn a_full_queue_of_kernels_never_overwrites_the_running_one() {
    let t = setup();
    let _node = NodeOn::new("ring");
    unsafe { assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS) };
    let (s1, s2) = (stream(), stream());
    let start = now();
    assert_eq!(launch(t.busy, s1, 1000 * MS), CUDA_SUCCESS);
    let _ = clock(0); // the 1 s head starts and is collected (collected = head + 1)
    for i in 0..1024 {
        assert_eq!(launch(t.busy, if i % 2 == 0 { s1 } else { s2 }, MS), CUDA_SUCCESS);
    }
    let launched = now() - start;
    let (mut last, mut back, mut done) = (clock(0), 0u64, 0u64);
    while now() < start + 6000 * MS {
        let c = clock(0);
        if c < last {
            back = back.max(last - c);
        }
        last = c;
        if unsafe { cuStreamQuery(s1) == CUDA_SUCCESS && cuStreamQuery(s2) == CUDA_SUCCESS } {
            done = now() - start;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // (1 s, then 1 024 ms of 1 ms kernels on two streams: about 2 025 ms; the solo clock never
    // goes back)
    assert!(back == 0 && done > 0 && done < 2300 * MS, "launched in {} ms, done after {} ms, clock back by {} ms", launched / MS, done / MS, back / MS);
}

#[test]
fn a_lock_holder_that_exited_is_replaced_at_once_even_unreaped() {
    let _t = setup();
    let _node = NodeOn::new("zombie");
    let (pid, fd) = fork_child(|| {
        std::mem::forget(crate::node::active().unwrap().arb_lock(0, 3));
        1
    });
    let mut v = 0u64;
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    std::thread::sleep(Duration::from_millis(50)); // the child has exited; not reaped yet
    let t0 = Instant::now();
    let _ = clock(0);
    let took = t0.elapsed();
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(fd);
    }
    let t1 = Instant::now();
    let _ = clock(0);
    assert!(took < Duration::from_secs(1) && t1.elapsed() < Duration::from_secs(1), "{took:?} while the holder is a zombie, {:?} once reaped", t1.elapsed());
}

#[test]
fn an_event_right_before_a_kernel_waits_with_it_for_another_process_turn() {
    let t = setup();
    let _node = NodeOn::new("with");
    unsafe { assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS) };
    let busy = t.busy;
    let (s1, s2) = (stream(), stream());
    let (a, b) = (event(0), event(0));
    unsafe {
        // our 300 ms kernel; meanwhile another process queues 500 ms of work, which gets the
        // device when ours ends (our slice is over); the event `a`, submitted on s2 right
        // before our next kernel, is reached when that kernel gets the device: 500 ms after
        // `b` (the end of the first kernel), in the order they were submitted
        assert_eq!(launch(busy, s1, 300 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(b, s1), CUDA_SUCCESS);
        let child = fork_child(move || {
            let s: CUstream = std::ptr::null_mut();
            let rc = launch(busy, s, 500 * MS);
            cuCtxSynchronize();
            rc as u64
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(cuEventRecord(a, s2), CUDA_SUCCESS);
        assert_eq!(launch(busy, s2, 10 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(a), CUDA_ERROR_NOT_READY);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(join_child(child), 0);
        let ba = elapsed_ms(b, a);
        assert!((499.0..=505.0).contains(&ba), "elapsed(b, a) = {ba} ms");
    }
}

#[test]
fn an_event_not_reached_yet_is_never_stamped_before_one_reached() {
    let t = setup();
    let _node = NodeOn::new("with2");
    unsafe { assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS) };
    let (s1, s2) = (stream(), stream());
    let (a, x) = (event(0), event(0));
    unsafe {
        assert_eq!(cuEventRecord(a, s2), CUDA_SUCCESS); // s2 idle, device idle
        assert_eq!(launch(t.busy, s1, 50 * MS), CUDA_SUCCESS);
        assert_eq!(launch(t.busy, s2, 10 * MS), CUDA_SUCCESS);
        assert_eq!(cuEventRecord(x, s1), CUDA_SUCCESS); // end of the 50 ms kernel
        std::thread::sleep(Duration::from_millis(10));
        // (`a` does not go with the s2 kernel: the s1 kernel was submitted between them)
        assert_eq!(cuEventQuery(a), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(x), CUDA_ERROR_NOT_READY);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        // (`x` is 50 ms after the s1 kernel was submitted, which came after `a`: exactly 50 ms
        // or more; the upper bound is loose, for loaded cores and emulation)
        let xa = elapsed_ms(x, a);
        assert!((-60.0..=-49.99).contains(&xa), "elapsed(x, a) = {xa} ms");
    }
}

#[test]
fn a_lock_left_by_an_attachment_whose_slot_was_claimed_again_is_replaced_at_once() {
    let _t = setup();
    let path = crate::node::tests::temp_path("reuse");
    let totals = vec![16u64 << 30; crate::devices::physical().len()];
    let gone = crate::node::Node::attach(&path, &totals).unwrap();
    let slot = gone.slot();
    // it dies holding device 0's lock (its slot lock goes with its descriptor)
    std::mem::forget(gone.arb_lock(0, 3));
    drop(gone);
    let next = crate::node::Node::attach(&path, &totals).unwrap();
    assert_eq!(next.slot(), slot, "the slot is claimed again");
    let t0 = Instant::now();
    assert!(next.arb_lock(0, 3).is_some());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    drop(next);
    let _ = std::fs::remove_dir_all(std::path::Path::new(&path).parent().unwrap());
}

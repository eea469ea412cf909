//! Graph memory (see `graphs`): instantiation records a graph's allocation nodes, the first
//! upload or launch of an executable graph is counted (or refused) before the driver takes
//! the memory, destruction and trims are settled on the driver's figures. Launches are also
//! counted by the placement log (`placement`).

use std::ffi::{c_char, c_void};

use crate::driver::ffi::*;
use crate::state::State;

type Graph = *mut c_void;
type Exec = *mut c_void;

/// An instantiation whose graph memory cannot be recorded (`bounded`) is undone and refused:
/// its launches would not be counted.
unsafe fn instantiated(st: &State, result: CUresult, exec: *mut Exec, graph: Graph) -> CUresult {
    if result == CUDA_SUCCESS && !exec.is_null() {
        if let Err(stuck) = st.graph_instantiated(*exec as usize, graph) {
            // (Acquire: pairs with `intercept::resolve_real`'s Release, as in `intercept::enter`)
            let destroy = crate::hooks::REAL[crate::hooks::Hook::cuGraphExecDestroy as usize].load(std::sync::atomic::Ordering::Acquire);
            if destroy != 0 {
                // SAFETY: the driver's cuGraphExecDestroy of the executable graph it just made.
                std::mem::transmute::<usize, unsafe extern "C" fn(Exec) -> CUresult>(destroy)(*exec);
            }
            return crate::platform::log::refuse("cuGraphInstantiate", stuck, CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    result
}

pub unsafe fn instantiate_with_flags(st: &State, real: unsafe extern "C" fn(*mut Exec, Graph, u64) -> CUresult, exec: *mut Exec, graph: Graph, flags: u64) -> CUresult {
    instantiated(st, real(exec, graph, flags), exec, graph)
}

pub unsafe fn instantiate_with_params(st: &State, real: unsafe extern "C" fn(*mut Exec, Graph, *mut c_void) -> CUresult, exec: *mut Exec, graph: Graph, params: *mut c_void) -> CUresult {
    instantiated(st, real(exec, graph, params), exec, graph)
}

pub unsafe fn instantiate_v1(
    st: &State,
    real: unsafe extern "C" fn(*mut Exec, Graph, *mut c_void, *mut c_char, usize) -> CUresult,
    exec: *mut Exec,
    graph: Graph,
    error_node: *mut c_void,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    instantiated(st, real(exec, graph, error_node, log, log_size), exec, graph)
}

pub unsafe fn launch(st: &State, real: unsafe extern "C" fn(Exec, CUstream) -> CUresult, exec: Exec, stream: CUstream) -> CUresult {
    launched(st, st.graph_launch("cuGraphLaunch", exec as usize, || st.paced_launch(stream, false, || real(exec, stream))), exec, stream, false)
}

pub unsafe fn launch_ptsz(st: &State, real: unsafe extern "C" fn(Exec, CUstream) -> CUresult, exec: Exec, stream: CUstream) -> CUresult {
    launched(st, st.graph_launch("cuGraphLaunch", exec as usize, || st.paced_launch(stream, true, || real(exec, stream))), exec, stream, true)
}

/// The placement log counts a graph's launches (not its nodes').
fn launched(st: &State, result: CUresult, exec: Exec, stream: CUstream, per_thread: bool) -> CUresult {
    if result == CUDA_SUCCESS {
        st.place_graph_launch(exec, stream, per_thread);
    }
    result
}

pub unsafe fn upload(st: &State, real: unsafe extern "C" fn(Exec, CUstream) -> CUresult, exec: Exec, stream: CUstream) -> CUresult {
    st.graph_launch("cuGraphUpload", exec as usize, || real(exec, stream))
}

pub unsafe fn exec_destroy(st: &State, real: unsafe extern "C" fn(Exec) -> CUresult, exec: Exec) -> CUresult {
    let result = real(exec);
    if result == CUDA_SUCCESS {
        st.graph_destroyed(exec as usize);
        st.forget_graph(exec);
    }
    result
}

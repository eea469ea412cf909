//! The prose of the help pages of `cdi` and `device-plugin` (the Kubernetes and container
//! engines), in the layout of `help.rs`.

pub const CDI_DESCRIPTION: &str = "\
DESCRIPTION
    Writes a Container Device Interface (CDI) spec, kind gpushim.dev/gpu, for the GPUs the
    driver shows (NVML): device I is GPU I whole and, with --slices N, devices I-0 ... I-(N-1)
    are its slices. Every device sets LD_PRELOAD=/opt/gpushim/lib/libgpushim.so (the library,
    mounted read-only from the host) and GPUSHIM_VISIBLE_DEVICES=<the GPU's UUID>; a slice
    also sets GPUSHIM_MEMORY_LIMIT=<the GPU's memory / N> and GPUSHIM_SHARED_QUOTA=gpushim-
    <UUID>-<K> (the container's processes share one budget), and with --compute
    GPUSHIM_COMPUTE_LIMIT=<100/N>%. It adds no device node and no driver library: combine it
    with NVIDIA's spec (nvidia.com/gpu=all), which brings those. cdiVersion 0.5.0 (podman 4.3
    accepts nothing newer). Write it to /etc/cdi or /var/run/cdi, where runtimes look. A GPU
    that NVML reports lost is left out, with a warning naming it.";

pub const CDI_AFTER: &str = "\
EXIT STATUS
    0 (also with a lost GPU left out); 1 when the GPUs cannot be listed (or every one is lost),
    the library cannot be found or the file cannot be written; 2 for a bad command line.

EXAMPLES
    gpushim cdi generate --slices 4 --output /etc/cdi/gpushim.json
    podman run --device nvidia.com/gpu=all --device gpushim.dev/gpu=0-1 IMAGE nvidia-smi";

pub const PLUGIN_DESCRIPTION: &str = "\
DESCRIPTION
    A Kubernetes device plugin (kubelet device plugin API v1beta1) for the resource
    gpushim.dev/gpu. It registers at DIR/kubelet.sock, serves on DIR/gpushim.sock and offers one
    device per slice (IDs I-K; I when there are no slices), healthy while NVML answers for its GPU
    (checked every 5 s; a GPU that is lost turns its devices Unhealthy, and so does every device
    when a check takes longer than --health-timeout). A GPU lost at start is left out, with a
    warning. At start it writes the CDI spec of the devices it offers (the edits of gpushim cdi
    generate) to CDI-DIR/gpushim-device-plugin.json. Allocate answers with the CDI names
    (gpushim.dev/gpu=I-K; none with --no-cdi) and the same environment and read-only library
    mount for runtimes without CDI, plus NVIDIA_VISIBLE_DEVICES=<the GPUs' UUIDs>, with which
    NVIDIA's container runtime brings the device nodes and driver libraries; an Unhealthy device
    is refused. When the kubelet restarts (kubelet.sock is made again) it serves and registers
    again. SIGTERM or SIGINT: removes its socket and its spec and exits 0, without waiting for a
    blocked NVML call. NVIDIA's own device plugin must be off on the node. Logs go to stderr.";

pub const PLUGIN_AFTER: &str = "\
EXIT STATUS
    0 after SIGTERM or SIGINT; 1 when the GPUs cannot be listed (or every one is lost), the
    library cannot be found, the spec cannot be written or the socket cannot be made at start;
    2 for a bad command line.

EXAMPLES
    gpushim device-plugin --slices 4
    gpushim device-plugin --slices 2 --compute --library /var/lib/gpushim/lib/libgpushim.so";

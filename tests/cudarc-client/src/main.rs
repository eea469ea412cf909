//! A real Rust CUDA client for gpushim's tests: cudarc with dynamic loading opens the driver
//! itself and resolves every function with `dlsym`, the way many Rust programs do.
//!
//! Usage: `cudarc-client CHUNK_BYTES` — on device 0, allocates CHUNK_BYTES blocks through
//! cudarc's safe API until the driver refuses, frees one and allocates again, and prints
//! `key=value` lines for the test to check.

use cudarc::driver::{result, CudaContext, DriverError};

fn main() {
    let chunk: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1 << 30);
    if let Err(e) = run(chunk) {
        println!("error={e:?}");
        std::process::exit(1);
    }
}

fn run(chunk: usize) -> Result<(), DriverError> {
    let ctx = CudaContext::new(0)?;
    println!("device_count={}", CudaContext::device_count()?);
    let dev = result::device::get(0)?;
    // SAFETY: `dev` came from cuDeviceGet.
    println!("total_mem={}", unsafe { result::device::total_mem(dev) }?);
    let (free, total) = ctx.mem_get_info()?;
    println!("meminfo_free={free}");
    println!("meminfo_total={total}");

    let stream = ctx.default_stream();
    let mut blocks = Vec::new();
    let refusal = loop {
        // SAFETY: the memory is never read (uninitialised device memory is fine to hold).
        match unsafe { stream.alloc::<u8>(chunk) } {
            Ok(b) => blocks.push(b),
            Err(e) => break e,
        }
        if blocks.len() > 1024 {
            println!("refusal=none");
            return Ok(());
        }
    };
    println!("allocated_blocks={}", blocks.len());
    println!("refusal={:?}", refusal.0);
    let (free, _) = ctx.mem_get_info()?;
    println!("meminfo_free_full={free}");

    blocks.pop();
    // A small zeroed allocation too: cudarc's memset path on memory the shim counted.
    let zeros = stream.alloc_zeros::<u8>(4096)?;
    println!("zeroed={}", stream.clone_dtoh(&zeros)?.iter().all(|&b| b == 0));
    drop(zeros);
    // SAFETY: as above.
    match unsafe { stream.alloc::<u8>(chunk) } {
        Ok(b) => {
            println!("retry=ok");
            blocks.push(b);
        }
        Err(e) => println!("retry={:?}", e.0),
    }
    drop(blocks);
    stream.synchronize()?;
    let (free, _) = ctx.mem_get_info()?;
    println!("meminfo_free_after={free}");
    println!("done=1");
    Ok(())
}

//! Peak memory of a stretch of work, and what the device is.
//!
//! On CUDA, candle allocates through cudarc's stream-ordered allocator (`cuMemAllocAsync`)
//! whenever the device supports it, i.e. from the device's current memory pool: the pool's
//! `USED_MEM_HIGH` attribute is then the exact high-water mark of candle's tensors (weights
//! included), and it can be reset between measurements. The CUDA context, cuBLAS workspaces
//! and loaded kernels live outside the pool; `cuMemGetInfo` reports the whole device.
//! On CPU, the process's peak resident set (`VmHWM`, reset through `/proc/self/clear_refs`).

use serde_json::{Value, json};

use crate::Failure;

pub enum Probe {
    Host,
    #[cfg(feature = "cuda")]
    Cuda(cuda::Pool),
}

impl Probe {
    pub fn new(device: &candle_core::Device) -> Result<Self, Failure> {
        match device {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(cuda) => Ok(Probe::Cuda(cuda::Pool::new(cuda)?)),
            _ => Ok(Probe::Host),
        }
    }

    /// Starts a new high-water mark at the current usage.
    pub fn reset_peak(&self) {
        match self {
            Probe::Host => {
                // "5" resets the peak RSS (Linux ≥ 4.0); without it the peak is the process's.
                let _ = std::fs::write("/proc/self/clear_refs", "5");
            }
            #[cfg(feature = "cuda")]
            Probe::Cuda(pool) => pool.reset_peak(),
        }
    }

    /// Peak bytes since the last reset.
    pub fn peak_bytes(&self) -> Option<u64> {
        match self {
            Probe::Host => host_status_kib("VmHWM:").map(|kib| kib * 1024),
            #[cfg(feature = "cuda")]
            Probe::Cuda(pool) => pool.used_high(),
        }
    }

    /// Bytes in use now (device tensors on CUDA, resident set on CPU).
    pub fn current_bytes(&self) -> Option<u64> {
        match self {
            Probe::Host => host_status_kib("VmRSS:").map(|kib| kib * 1024),
            #[cfg(feature = "cuda")]
            Probe::Cuda(pool) => pool.used_now(),
        }
    }

    /// What is measured, and the device.
    pub fn describe(&self) -> Value {
        match self {
            Probe::Host => json!({
                "kind": "cpu",
                "memory_measure": "process peak resident set (VmHWM)",
                "threads": candle_core::utils::get_num_threads(),
            }),
            #[cfg(feature = "cuda")]
            Probe::Cuda(pool) => pool.describe(),
        }
    }
}

fn host_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ffi::c_void;
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{CudaContext, sys};
    use serde_json::{Value, json};

    use crate::Failure;

    pub struct Pool {
        context: Arc<CudaContext>,
        pool: sys::CUmemoryPool,
    }

    impl Pool {
        pub fn new(device: &candle_core::CudaDevice) -> Result<Self, Failure> {
            let stream = device.cuda_stream();
            let context = stream.context().clone();
            context.bind_to_thread()?;
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: a valid device of a context bound to this thread, and a place to write.
            unsafe { sys::cuDeviceGetMemPool(&mut pool, context.cu_device()) }.result()?;
            Ok(Self { context, pool })
        }

        fn attribute(&self, attribute: sys::CUmemPool_attribute) -> Option<u64> {
            let mut value: u64 = 0;
            // SAFETY: the *_MEM_* attributes are cuuint64_t, as `value`.
            unsafe {
                sys::cuMemPoolGetAttribute(
                    self.pool,
                    attribute,
                    (&mut value as *mut u64).cast::<c_void>(),
                )
            }
            .result()
            .ok()?;
            Some(value)
        }

        pub fn used_high(&self) -> Option<u64> {
            if !self.context.has_async_alloc() {
                return None;
            }
            self.context.synchronize().ok()?;
            self.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }

        pub fn used_now(&self) -> Option<u64> {
            if !self.context.has_async_alloc() {
                return None;
            }
            self.context.synchronize().ok()?;
            self.attribute(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        pub fn reset_peak(&self) {
            let _ = self.context.synchronize();
            let mut zero: u64 = 0;
            // SAFETY: as in `attribute`; only 0 may be written to the high-water marks.
            let _ = unsafe {
                sys::cuMemPoolSetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast::<c_void>(),
                )
            };
        }

        pub fn describe(&self) -> Value {
            let mut driver = 0i32;
            // SAFETY: writes one int.
            let driver = unsafe { sys::cuDriverGetVersion(&mut driver) }
                .result()
                .ok()
                .map(|()| format!("{}.{}", driver / 1000, driver % 1000 / 10));
            let (free, total) = self.context.mem_get_info().unwrap_or((0, 0));
            json!({
                "kind": "cuda",
                "ordinal": self.context.ordinal(),
                "name": self.context.name().ok(),
                "compute_capability": self.context.compute_capability().ok()
                    .map(|(major, minor)| format!("{major}.{minor}")),
                "driver_cuda_version": driver,
                "total_memory_bytes": total,
                "free_memory_bytes_at_start": free,
                "stream_ordered_allocator": self.context.has_async_alloc(),
                "memory_measure": if self.context.has_async_alloc() {
                    "memory pool high-water mark (CU_MEMPOOL_ATTR_USED_MEM_HIGH): candle's tensors"
                } else {
                    "no stream-ordered allocator: peak not measured"
                },
            })
        }
    }
}

//! A fixed set of values lent out one caller at a time (ONNX Runtime's `Session::run` needs
//! `&mut`), so concurrent calls run in parallel up to the pool size and otherwise wait.

use std::sync::{Condvar, Mutex, PoisonError};

pub(crate) struct Pool<T> {
    idle: Mutex<Vec<T>>,
    returned: Condvar,
    size: usize,
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("Pool").field("idle", &idle).finish()
    }
}

/// Puts the value back even if the borrower panics, so the pool never shrinks and waiters
/// never hang.
struct Lease<'a, T> {
    pool: &'a Pool<T>,
    value: Option<T>,
}

impl<T> Drop for Lease<'_, T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(value);
            self.pool.returned.notify_one();
        }
    }
}

impl<T> Pool<T> {
    pub(crate) fn new(values: Vec<T>) -> Self {
        assert!(!values.is_empty(), "the builder checks sessions >= 1");
        Self {
            size: values.len(),
            idle: Mutex::new(values),
            returned: Condvar::new(),
        }
    }

    /// Number of values, lent or idle.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Runs `f` with an idle value, waiting for one if all are lent.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let value = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(v) = idle.pop() {
                    break v;
                }
                idle = self
                    .returned
                    .wait(idle)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let mut lease = Lease {
            pool: self,
            value: Some(value),
        };
        f(lease.value.as_mut().expect("set just above"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn lends_at_most_pool_size_at_once_and_survives_panics() {
        let pool = Arc::new(Pool::new(vec![0u32, 0]));
        let busy = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (pool, busy, peak) = (pool.clone(), busy.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            pool.with(|v| {
                                let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                *v += 1;
                                std::thread::yield_now();
                                busy.fetch_sub(1, Ordering::SeqCst);
                                if t == 0 {
                                    panic!("borrower panics");
                                }
                            })
                        }));
                        assert_eq!(r.is_err(), t == 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::SeqCst) <= 2);
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.len(), 2);
        assert_eq!(idle.iter().sum::<u32>(), 8 * 50);
    }
}

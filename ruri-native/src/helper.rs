//! A second thread for one short text's products (int8 and fp32): [`Helper::run`] hands out the pieces of
//! a job (column ranges of a product) to the caller's thread and to a helper thread, which
//! claim them from one counter. A lone query's products are a few rows against every weight
//! of the model, so each core streaming half of them is what a second core can buy (the
//! pool's row split costs a wake-up per step and still streams all weights on both).
//!
//! The helper spins for [`SPIN`] after each job (the next product of the same text follows
//! within microseconds), then parks until a job is posted: it burns no idle core between
//! texts. A job is never waited for: if the helper is parked or slow to wake, the caller
//! claims every piece itself. While more than one call runs (the count its owner keeps, see
//! [`Helper::start`]), and for [`HOLD`] after, a job runs on its caller alone, and the helper
//! parks at once instead of spinning: two callers already fill two cores, and a third thread
//! only takes time from them (BENCHMARKS.md, eleventh step).
//!
//! Which thread computes a piece changes no bit: each piece is computed whole by one kernel
//! (int8) or one version of the fp32 GEMM.
//!
//! The `unsafe` here: a job is borrowed from the caller's stack and handed to the helper thread
//! as a raw pointer; [`Helper::run`] does not return (nor unwind) before the helper has
//! stopped using it.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::kernels::aligned::Aligned;

/// How long the helper spins for the next job before it parks.
const SPIN: Duration = Duration::from_micros(200);
/// After another call was seen running, jobs stay on their callers for this long: two
/// callers that each start their next text at once leave each other alone only for
/// moments, and a helper woken in those moments takes a core from the other call.
const HOLD: Duration = Duration::from_millis(2);

/// A helper thread; dropping it stops and joins the thread.
pub(crate) struct Helper {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The helper thread's scratch (its worker index is 1), for the one caller at a time.
    pub(crate) scratch: Mutex<Aligned<u8>>,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper").finish_non_exhaustive()
    }
}

/// The job's code: `run(piece, worker)`, worker 0 the caller and 1 the helper.
type Work<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// A posted job: pointers into the caller's frame of [`Helper::run`].
#[derive(Clone, Copy)]
struct Job {
    run: *const Work<'static>,
    next: *const AtomicUsize,
    pieces: usize,
}

// SAFETY: a `Job` only travels to the helper thread while `Helper::run`'s frame, which owns
// what it points to, waits for the helper to be done with it (`in_use`); the work is `Sync`
// and the counter atomic, so using them from two threads is sound.
unsafe impl Send for Job {}

struct Shared {
    /// The job being run, while its caller runs it too.
    slot: Mutex<Option<Job>>,
    /// Bumped when a job is posted: what the spinning helper watches.
    posted: AtomicU64,
    /// The helper holds a job's pointers (set under `slot`'s lock).
    in_use: AtomicBool,
    /// A caller is in [`Helper::run`] (one at a time; the others run alone).
    busy: AtomicBool,
    /// What a piece that panicked on the helper thread panicked with (moved, not dropped,
    /// there: a payload whose drop panics cannot take the helper thread down).
    payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// The helper is parked; `wake` wakes it.
    parked: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
    /// Calls running on the helper's owner; more than one: no sharing, no spinning.
    calls: Arc<AtomicUsize>,
    /// When more than one call was last seen, in nanoseconds from `epoch`.
    contended_at: AtomicU64,
    epoch: Instant,
}

/// Claims pieces of `job` until none is left.
///
/// # Safety
/// `job`'s pointers are valid for the whole call.
unsafe fn claim(job: Job, worker: usize) {
    loop {
        // SAFETY: valid for the call (the caller's contract).
        let piece = unsafe { &*job.next }.fetch_add(1, Ordering::Relaxed);
        if piece >= job.pieces {
            return;
        }
        // SAFETY: as above.
        unsafe { (*job.run)(piece, worker) };
    }
}

impl Shared {
    /// More than one call runs on the helper's owner.
    fn contended(&self) -> bool {
        self.calls.load(Ordering::Relaxed) > 1
    }

    /// More than one call runs now, or did within [`HOLD`]. The clock is read only then:
    /// a lone caller, the common case, pays two loads a product.
    fn recently_contended(&self) -> bool {
        // Nanoseconds since `epoch`, at least 1 (0 means "not since HOLD ran out").
        let now = || u64::try_from(self.epoch.elapsed().as_nanos()).map_or(u64::MAX, |t| t.max(1));
        if self.contended() {
            self.contended_at.store(now(), Ordering::Relaxed);
            return true;
        }
        let at = self.contended_at.load(Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        if now().saturating_sub(at) < HOLD.as_nanos() as u64 {
            return true;
        }
        // HOLD ran out (unless another call stored a later time meanwhile).
        let _ = self
            .contended_at
            .compare_exchange(at, 0, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    fn serve(&self) {
        let mut seen = self.posted.load(Ordering::Acquire);
        loop {
            // Spin for the next job, then park.
            let start = Instant::now();
            let mut spins = 0u32;
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                let posted = self.posted.load(Ordering::Acquire);
                if posted != seen {
                    seen = posted;
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) && (self.contended() || start.elapsed() > SPIN) {
                    let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
                    *parked = true;
                    // A caller bumps `posted` before it takes this lock to wake us: either
                    // we see the bump here, or we are waiting when it notifies.
                    while self.posted.load(Ordering::Acquire) == seen
                        && !self.stop.load(Ordering::Acquire)
                    {
                        parked = self
                            .wake
                            .wait(parked)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    *parked = false;
                    spins = 0;
                }
                std::hint::spin_loop();
            }
            let job = {
                let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
                match *slot {
                    Some(job) => {
                        // Under the lock: the caller takes the job back under it too, so
                        // either it sees `in_use` or we see no job.
                        self.in_use.store(true, Ordering::Relaxed);
                        job
                    }
                    None => continue,
                }
            };
            // Clears `in_use` however this ends.
            let _done = Done(&self.in_use);
            // SAFETY: the caller keeps the job's frame alive until `in_use` is false again
            // (`Retract`).
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| unsafe { claim(job, 1) })) {
                *self.payload.lock().unwrap_or_else(PoisonError::into_inner) = Some(payload);
            }
        }
    }
}

/// Sets the helper's `in_use` back to false when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Takes a posted job back and waits until the helper no longer uses it; frees the helper
/// for the next caller. Runs on return and on unwinding alike.
struct Retract<'a>(&'a Shared);

impl Drop for Retract<'_> {
    fn drop(&mut self) {
        *self.0.slot.lock().unwrap_or_else(PoisonError::into_inner) = None;
        // The helper is inside a piece: spin a little, then yield (it may have lost its core).
        let mut spins = 0u32;
        while self.0.in_use.load(Ordering::Acquire) {
            spins = spins.saturating_add(1);
            if spins < 2048 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.0.busy.store(false, Ordering::Release);
    }
}

impl Helper {
    /// Starts the helper thread. `calls` counts the calls running on its owner (each
    /// [`Helper::run`] comes from one of them): while it is above one, jobs run on their
    /// callers alone and the helper does not spin.
    pub(crate) fn start(calls: Arc<AtomicUsize>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(None),
            posted: AtomicU64::new(0),
            in_use: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            payload: Mutex::new(None),
            parked: Mutex::new(false),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            calls,
            contended_at: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ruri-native-helper".into())
            .spawn(move || serving.serve())?;
        Ok(Self {
            shared,
            thread: Some(thread),
            scratch: Mutex::new(Aligned::default()),
        })
    }

    /// Runs `work(piece, worker)` once for every piece in `0..pieces`, on the caller's
    /// thread (worker 0) and on the helper's (worker 1), and returns when all are done. While
    /// another caller runs a job (or from inside a piece), the caller runs every piece
    /// itself, as while other calls run on the helper's owner (see [`Helper::start`]). A
    /// panic in a piece on the helper panics here.
    pub(crate) fn run(&self, pieces: usize, work: &Work<'_>) {
        let shared = &*self.shared;
        if pieces < 2 || shared.recently_contended() || shared.busy.swap(true, Ordering::Acquire) {
            (0..pieces).for_each(|piece| work(piece, 0));
            return;
        }
        // A payload left by a job whose caller panicked too (that panic went on instead).
        let stale = shared
            .payload
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let next = AtomicUsize::new(0);
        let retract = Retract(shared);
        drop(stale);
        // SAFETY: only the lifetime is erased (a fat pointer to a fat pointer). The `Job`
        // holding it lives only in `shared.slot` and in the helper's `serve` while `in_use`
        // is set, and `retract` (dropped before `next` and `work` end, on return and on
        // unwinding) empties the slot and waits until `in_use` is false.
        let run: *const Work<'static> = unsafe {
            std::mem::transmute::<*const Work<'_>, *const Work<'static>>(work as *const Work<'_>)
        };
        let job = Job {
            run,
            next: &next,
            pieces,
        };
        *shared.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        shared.posted.fetch_add(1, Ordering::Release);
        if *shared.parked.lock().unwrap_or_else(PoisonError::into_inner) {
            shared.wake.notify_one();
        }
        // SAFETY: `next` and `work` live until `run` returns.
        unsafe { claim(job, 0) };
        drop(retract);
        let payload = shared
            .payload
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(payload) = payload {
            // The helper's panic, as it was, on the caller's thread.
            resume_unwind(payload);
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _parked = self
                .shared
                .parked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A buffer cut into pieces that [`Helper::run`]'s workers fill: piece `i` is
/// `bounds[i]..bounds[i + 1]`, each handed out once.
pub(crate) struct Pieces<'a, T> {
    ptr: *mut T,
    bounds: &'a [usize],
    taken: Vec<AtomicBool>,
    _buffer: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: `take` hands each piece out once, so no two threads reach the same element, and
// a piece (`&mut [T]`) may go to another thread when `T: Send`.
unsafe impl<T: Send> Sync for Pieces<'_, T> {}

impl<'a, T> Pieces<'a, T> {
    /// `bounds` ascending, from 0, its last at most `buffer.len()`.
    pub(crate) fn new(buffer: &'a mut [T], bounds: &'a [usize]) -> Self {
        assert!(bounds.first() == Some(&0), "pieces start at 0");
        assert!(
            bounds.windows(2).all(|w| w[0] <= w[1]) && bounds[bounds.len() - 1] <= buffer.len(),
            "pieces ascending inside the buffer"
        );
        Self {
            ptr: buffer.as_mut_ptr(),
            bounds,
            taken: (1..bounds.len()).map(|_| AtomicBool::new(false)).collect(),
            _buffer: std::marker::PhantomData,
        }
    }

    /// Piece `i`, the first time it is asked for; `None` after (or past the last piece).
    // A mutable piece from a shared `Pieces` is the point: each is handed out once (`taken`),
    // which is what makes it sound for two threads.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn take(&self, i: usize) -> Option<&mut [T]> {
        if self.taken.get(i)?.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (lo, hi) = (self.bounds[i], self.bounds[i + 1]);
        // SAFETY: lo..hi lies inside the buffer (checked in `new`), the pieces do not overlap
        // (ascending bounds), and this one is handed out once (`taken`); the buffer is
        // borrowed mutably for 'a.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(lo), hi - lo) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_piece_runs_once_whether_the_helper_spins_or_is_parked() {
        let helper = Helper::start(Default::default()).expect("a thread");
        for round in 0..400 {
            let pieces = round % 37;
            let counts: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
            let workers: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
            helper.run(pieces, &|piece, worker| {
                counts[piece].fetch_add(1, Ordering::Relaxed);
                workers[worker].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            let total: usize = workers.iter().map(|w| w.load(Ordering::Relaxed)).sum();
            assert_eq!(total, pieces);
            if round % 100 == 99 {
                // Long enough for the helper to park.
                std::thread::sleep(SPIN * 5);
            }
        }
    }

    #[test]
    fn the_helper_takes_pieces_when_the_caller_is_slow() {
        let helper = Helper::start(Default::default()).expect("a thread");
        let by_helper = AtomicUsize::new(0);
        for _ in 0..20 {
            helper.run(8, &|_, worker| {
                by_helper.fetch_add(worker, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            });
        }
        assert!(
            by_helper.load(Ordering::Relaxed) > 0,
            "the helper never ran a piece"
        );
    }

    #[test]
    fn while_other_calls_run_the_caller_runs_every_piece() {
        let calls = Arc::new(AtomicUsize::new(2));
        let helper = Helper::start(Arc::clone(&calls)).expect("a thread");
        let slow_job = |by_helper: &AtomicUsize| {
            helper.run(8, &|_, worker| {
                by_helper.fetch_add(worker, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            });
        };
        let by_helper = AtomicUsize::new(0);
        for _ in 0..20 {
            slow_job(&by_helper);
        }
        assert_eq!(
            by_helper.load(Ordering::Relaxed),
            0,
            "the helper ran a piece"
        );
        // Alone again, after HOLD: the helper (parked meanwhile) serves again.
        calls.store(1, Ordering::Relaxed);
        std::thread::sleep(HOLD * 2);
        for _ in 0..20 {
            slow_job(&by_helper);
        }
        assert!(
            by_helper.load(Ordering::Relaxed) > 0,
            "the helper never ran a piece"
        );
    }

    #[test]
    fn a_job_inside_a_piece_and_concurrent_callers_run_alone() {
        let helper = Helper::start(Default::default()).expect("a thread");
        let inner = AtomicUsize::new(0);
        helper.run(4, &|_, _| {
            helper.run(3, &|_, worker| {
                assert_eq!(worker, 0);
                inner.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(inner.load(Ordering::Relaxed), 12);
        let done = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        helper.run(5, &|_, _| {
                            done.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(done.load(Ordering::Relaxed), 3 * 200 * 5);
    }

    #[test]
    #[should_panic(expected = "piece")]
    fn a_panicking_piece_panics_in_the_caller() {
        let helper = Helper::start(Default::default()).expect("a thread");
        helper.run(64, &|piece, _| {
            std::thread::sleep(Duration::from_micros(50));
            assert!(piece != 63, "piece 63 fails");
        });
    }

    /// The caller's own piece panics while the helper is still writing into the caller's
    /// frame: the unwinding waits for it (a use after return would corrupt `cells` or the
    /// stack, and the check after the catch would see it).
    #[test]
    fn unwinding_waits_for_the_helper() {
        let helper = Helper::start(Default::default()).expect("a thread");
        for _ in 0..50 {
            let cells: Vec<AtomicUsize> = (0..16).map(|_| AtomicUsize::new(0)).collect();
            let caught = catch_unwind(AssertUnwindSafe(|| {
                helper.run(16, &|piece, worker| {
                    if worker == 0 {
                        panic!("the caller's piece {piece}");
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    cells[piece].store(1, Ordering::Relaxed);
                });
            }));
            assert!(caught.is_err());
            // Whatever the helper wrote, it wrote before the unwinding went on.
            let written: usize = cells.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            std::thread::sleep(Duration::from_millis(1));
            let later: usize = cells.iter().map(|c| c.load(Ordering::Relaxed)).sum();
            assert_eq!(written, later, "the helper wrote after run unwound");
        }
        // The helper still serves.
        let count = AtomicUsize::new(0);
        helper.run(8, &|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn pieces_are_handed_out_once() {
        let mut buffer = vec![0i32; 10];
        let bounds = [0, 3, 3, 10];
        let pieces = Pieces::new(&mut buffer, &bounds);
        assert_eq!(pieces.take(0).map(|p| p.len()), Some(3));
        assert!(pieces.take(0).is_none());
        assert_eq!(pieces.take(1).map(|p| p.len()), Some(0));
        pieces.take(2).expect("piece 2").fill(7);
        assert!(pieces.take(3).is_none());
        assert_eq!(buffer[3..], [7; 7]);
    }
}

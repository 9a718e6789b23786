//! Buffers that start on a cache line, for what the kernels stream with 512-bit loads (the
//! packed weights, attention's keys and values, the rows of activations): a load that
//! straddles two 64-byte lines costs two on Intel CPUs, and the allocator aligns large
//! buffers to 16 bytes only (glibc's mmap'd blocks start 16 bytes past a page, so every
//! 512-bit load of them split). BENCHMARKS.md, eighteenth step, measures it.
//!
//! The values live in an ordinary `Vec`, a few past its start: the allocator sees the same
//! requests as before (an over-aligned layout made glibc keep ≈ 12 MB more of a long text's
//! freed attention buffers resident), and no `unsafe` is needed.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Bytes of a cache line.
const LINE: usize = 64;

/// `len` values of `T` from a 64-byte boundary, read and written as a slice. `T` is a
/// plain number (its size divides 64 and is its alignment).
pub(crate) struct Aligned<T> {
    /// `start + len` values or more; `start` is where a line begins (empty and unallocated
    /// only when made by `default`).
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    /// Values a buffer holds past those asked for, to find a line's start among them.
    const SLACK: usize = LINE / size_of::<T>();

    /// `len` copies of `T::default()` (zero: memory the allocator zeroed, whose pages are
    /// not touched until written).
    pub(crate) fn zeroed(len: usize) -> Self {
        Self::filled(len, T::default())
    }

    /// `len` copies of `value`.
    pub(crate) fn filled(len: usize, value: T) -> Self {
        const {
            assert!(
                LINE.is_multiple_of(size_of::<T>()) && align_of::<T>() == size_of::<T>(),
                "a plain number"
            )
        };
        let total = len
            .checked_add(Self::SLACK)
            .expect("a buffer's size overflows");
        let buf = vec![value; total];
        let start = Self::line_start(&buf);
        Self { buf, start, len }
    }

    /// The first index of `buf` at a 64-byte boundary (the address is a multiple of `T`'s
    /// size, so some index among the first [`Self::SLACK`] is).
    fn line_start(buf: &[T]) -> usize {
        let bytes = (buf.as_ptr() as usize).wrapping_neg() % LINE;
        bytes / size_of::<T>()
    }

    /// Resizes to `len` values as `Vec::resize` does: the first ones kept, new ones `value`.
    pub(crate) fn resize(&mut self, len: usize, value: T) {
        if self.start + len > self.buf.len() {
            let mut grown = Self::filled(len.max(2 * self.len), value);
            grown.len = len;
            grown[..self.len].copy_from_slice(self);
            *self = grown;
            return;
        }
        let old = self.len;
        self.len = len;
        if len > old {
            self[old..].fill(value);
        }
    }

    /// `len` values, whatever they held (`T::default()` where the buffer grows): for a
    /// caller that writes each value before it reads it, and so needs no fill.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the x86 packers'
    pub(crate) fn resize_for_overwrite(&mut self, len: usize) {
        if self.start + len > self.buf.len() {
            let mut grown = Self::zeroed(len.max(2 * self.len));
            grown.len = len;
            *self = grown;
        } else {
            self.len = len;
        }
    }

    /// No values (the allocation kept).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

impl<T> Default for Aligned<T> {
    /// Empty, with nothing allocated (the first [`Aligned::resize`] that grows it finds a
    /// line in its allocation).
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            len: 0,
        }
    }
}

impl<T: Copy + Default> Clone for Aligned<T> {
    /// A copy from a line of its own (the allocation differs, so does its start).
    fn clone(&self) -> Self {
        let mut copy = Self::filled(self.len, T::default());
        copy.copy_from_slice(self);
        copy
    }
}

impl<T> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl<T> fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Aligned")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_holds_what_it_was_given() {
        for len in [0usize, 1, 15, 16, 17, 1000, 4099, 1 << 20] {
            let mut f = Aligned::<f32>::filled(len, 1.5);
            assert_eq!(f.len(), len);
            assert!(f.iter().all(|&v| v == 1.5));
            assert_eq!(f.as_ptr() as usize % 64, 0, "len {len}");
            f.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
            assert!(f.iter().enumerate().all(|(i, &v)| v == i as f32));
            let c = f.clone();
            assert_eq!((&c[..], c.as_ptr() as usize % 64), (&f[..], 0));
            let b = Aligned::<u8>::filled(len, 7);
            assert_eq!((b.len(), b.as_ptr() as usize % 64), (len, 0));
            assert!(b.iter().all(|&v| v == 7));
            let z = Aligned::<i32>::zeroed(len);
            assert_eq!((z.len(), z.as_ptr() as usize % 64), (len, 0));
            assert!(z.iter().all(|&v| v == 0));
        }
    }

    #[test]
    fn resizes_as_a_vec_does() {
        let mut a = Aligned::<u32>::default();
        let mut v = Vec::new();
        let steps = [
            (5, 1),
            (40, 2),
            (3, 3),
            (3, 4),
            (100, 5),
            (0, 6),
            (17, 7),
            (18, 8),
        ];
        for (i, (len, value)) in steps.into_iter().enumerate() {
            if i == 6 {
                a.clear();
                v.clear();
            }
            a.resize(len, value);
            v.resize(len, value);
            assert_eq!(&a[..], &v[..]);
            assert_eq!(a.as_ptr() as usize % 64, 0);
            a.iter_mut()
                .zip(&mut v)
                .enumerate()
                .for_each(|(i, (a, v))| {
                    *a = i as u32 * 3;
                    *v = i as u32 * 3;
                });
        }
    }
}

//! A pool of host staging buffers for copies to the device, reused from step to step.
//!
//! Page-locked (pinned) host memory is what lets a host→device copy run at the link's speed,
//! but allocating it costs milliseconds and locks physical pages: a buffer is taken once and
//! reused while batches keep their size. This module is the bookkeeping only — which buffer
//! is free, which is lent, when one is made or freed, the cap on memory held — behind
//! [`HostAlloc`], so the allocator is CUDA's `cuMemHostAlloc` in a CUDA build and plain memory
//! in tests.
//!
//! A buffer is lent as a [`Lease`] and goes back to the pool when the lease is dropped. A copy
//! still reading the buffer on the device is the allocator's business: CUDA's pinned slices
//! wait for it before the host writes into them again.

use std::sync::{Arc, Mutex, PoisonError};

/// A buffer of host memory, `len` elements long.
pub trait HostBuf {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Makes host buffers (page-locked in a CUDA build).
pub trait HostAlloc {
    type Buf: HostBuf;
    /// Bytes one element takes (the cap is in bytes).
    const ELEM_BYTES: usize;
    /// A new buffer of exactly `len` elements; its contents are unspecified.
    fn alloc(&self, len: usize) -> Result<Self::Buf, String>;
}

/// Why the pool lent nothing; the caller copies from pageable memory instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagingError {
    #[error("a staging buffer of {want} bytes would take the pool past its cap of {cap} bytes ({lent} bytes lent)")]
    Cap { want: usize, cap: usize, lent: usize },
    #[error("cannot allocate a staging buffer of {bytes} bytes: {reason}")]
    Alloc { bytes: usize, reason: String },
}

/// What the pool has done, for tests and for the run's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers allocated.
    pub allocated: u64,
    /// Leases served by a buffer that was already there.
    pub reused: u64,
    /// Idle buffers freed to make room under the cap.
    pub freed: u64,
    /// Bytes held now (lent and idle).
    pub held_bytes: usize,
}

struct Shelf<B> {
    idle: Vec<B>,
    lent_bytes: usize,
    stats: PoolStats,
}

/// Buffers lent out and given back; at most `cap_bytes` held at once.
pub struct StagingPool<A: HostAlloc> {
    alloc: A,
    cap_bytes: usize,
    shelf: Arc<Mutex<Shelf<A::Buf>>>,
}

impl<A: HostAlloc> StagingPool<A> {
    pub fn new(alloc: A, cap_bytes: usize) -> StagingPool<A> {
        let shelf = Shelf { idle: Vec::new(), lent_bytes: 0, stats: PoolStats::default() };
        StagingPool { alloc, cap_bytes, shelf: Arc::new(Mutex::new(shelf)) }
    }

    /// A buffer of exactly `len` elements (a copy sends the whole buffer): an idle one of that
    /// length when there is one, else a new one, after freeing idle buffers of other lengths
    /// (oldest first) as far as the cap needs. Never waits: a pool at its cap with every buffer
    /// lent answers [`StagingError::Cap`].
    pub fn take(&self, len: usize) -> Result<Lease<A::Buf>, StagingError> {
        let bytes = len.saturating_mul(A::ELEM_BYTES);
        let mut shelf = self.shelf.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = shelf.idle.iter().position(|b| b.len() == len) {
            let buf = shelf.idle.remove(i);
            shelf.lent_bytes += bytes;
            shelf.stats.reused += 1;
            return Ok(Lease { buf: Some(buf), bytes, home: self.shelf.clone() });
        }
        while shelf.stats.held_bytes.saturating_add(bytes) > self.cap_bytes && !shelf.idle.is_empty() {
            let old = shelf.idle.remove(0);
            shelf.stats.held_bytes -= old.len() * A::ELEM_BYTES;
            shelf.stats.freed += 1;
        }
        if shelf.stats.held_bytes.saturating_add(bytes) > self.cap_bytes {
            return Err(StagingError::Cap { want: bytes, cap: self.cap_bytes, lent: shelf.lent_bytes });
        }
        let buf = self.alloc.alloc(len).map_err(|reason| StagingError::Alloc { bytes, reason })?;
        shelf.stats.allocated += 1;
        shelf.stats.held_bytes += bytes;
        shelf.lent_bytes += bytes;
        Ok(Lease { buf: Some(buf), bytes, home: self.shelf.clone() })
    }

    pub fn stats(&self) -> PoolStats {
        self.shelf.lock().unwrap_or_else(PoisonError::into_inner).stats
    }

    /// Buffers waiting on the shelf.
    pub fn idle(&self) -> usize {
        self.shelf.lock().unwrap_or_else(PoisonError::into_inner).idle.len()
    }
}

/// A lent buffer; dropping it puts the buffer back on its pool's shelf (or frees it, when the
/// pool is gone).
pub struct Lease<B> {
    buf: Option<B>,
    bytes: usize,
    home: Arc<Mutex<Shelf<B>>>,
}

impl<B: HostBuf> std::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("len", &self.buf.as_ref().map(HostBuf::len)).finish()
    }
}

impl<B> std::ops::Deref for Lease<B> {
    type Target = B;
    fn deref(&self) -> &B {
        #[allow(clippy::expect_used)]
        self.buf.as_ref().expect("a lease holds its buffer until dropped")
    }
}

impl<B> std::ops::DerefMut for Lease<B> {
    fn deref_mut(&mut self) -> &mut B {
        #[allow(clippy::expect_used)]
        self.buf.as_mut().expect("a lease holds its buffer until dropped")
    }
}

impl<B> Drop for Lease<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let mut shelf = self.home.lock().unwrap_or_else(PoisonError::into_inner);
            shelf.lent_bytes = shelf.lent_bytes.saturating_sub(self.bytes);
            shelf.idle.push(buf);
        }
    }
}

/// Plain heap memory: the allocator on a CPU device and in tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapAlloc;

impl<T> HostBuf for Vec<T> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

impl HostAlloc for HeapAlloc {
    type Buf = Vec<u8>;
    const ELEM_BYTES: usize = 1;
    fn alloc(&self, len: usize) -> Result<Vec<u8>, String> {
        Ok(vec![0; len])
    }
}

/// Page-locked memory from the CUDA driver.
#[cfg(feature = "cuda")]
pub mod pinned {
    use super::{HostAlloc, HostBuf};
    use candle_core::cuda::cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice};
    use std::marker::PhantomData;
    use std::sync::Arc;

    impl<T> HostBuf for PinnedHostSlice<T> {
        fn len(&self) -> usize {
            PinnedHostSlice::len(self)
        }
    }

    /// `cuMemHostAlloc` in `ctx`, buffers of `T`.
    pub struct PinnedAlloc<T> {
        pub ctx: Arc<CudaContext>,
        pub elem: PhantomData<T>,
    }

    impl<T: DeviceRepr> HostAlloc for PinnedAlloc<T> {
        type Buf = PinnedHostSlice<T>;
        const ELEM_BYTES: usize = std::mem::size_of::<T>();
        fn alloc(&self, len: usize) -> Result<PinnedHostSlice<T>, String> {
            // SAFETY: the pool's users write every element they copy before the copy.
            unsafe { self.ctx.alloc_pinned::<T>(len) }.map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Counts allocations and can be told to fail.
    #[derive(Default)]
    struct Counting {
        made: Cell<usize>,
        fail: Cell<bool>,
    }

    impl HostAlloc for &Counting {
        type Buf = Vec<u8>;
        const ELEM_BYTES: usize = 4;
        fn alloc(&self, len: usize) -> Result<Vec<u8>, String> {
            if self.fail.get() {
                return Err("out of page-locked memory".into());
            }
            self.made.set(self.made.get() + 1);
            Ok(vec![0; len])
        }
    }

    #[test]
    fn a_returned_buffer_is_reused_for_the_same_length() {
        let a = Counting::default();
        let pool = StagingPool::new(&a, 1 << 20);
        for step in 0..5 {
            let mut lease = pool.take(100).unwrap();
            lease[0] = step;
            assert_eq!(lease.len(), 100);
        }
        assert_eq!(a.made.get(), 1);
        let s = pool.stats();
        assert_eq!((s.allocated, s.reused, s.freed, s.held_bytes), (1, 4, 0, 400));
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn two_leases_at_once_are_two_buffers_and_both_come_back() {
        let a = Counting::default();
        let pool = StagingPool::new(&a, 1 << 20);
        let (x, y) = (pool.take(10).unwrap(), pool.take(10).unwrap());
        assert_eq!(pool.idle(), 0);
        drop((x, y));
        assert_eq!(pool.idle(), 2);
        let _z = pool.take(10).unwrap();
        assert_eq!((a.made.get(), pool.stats().reused), (2, 1));
    }

    #[test]
    fn other_lengths_are_freed_oldest_first_to_stay_under_the_cap() {
        // Cap 1000 bytes = 250 elements of 4 bytes.
        let a = Counting::default();
        let pool = StagingPool::new(&a, 1000);
        drop(pool.take(100).unwrap()); // 400 bytes, idle
        drop(pool.take(120).unwrap()); // 480 bytes, idle: 880 held
        let lease = pool.take(50).unwrap(); // 200 more: the 100 goes, 680 held
        let s = pool.stats();
        assert_eq!((s.allocated, s.freed, s.held_bytes), (3, 1, 680));
        drop(lease);
        // The 120 is still there and reused.
        drop(pool.take(120).unwrap());
        assert_eq!(pool.stats().reused, 1);
    }

    #[test]
    fn at_the_cap_with_everything_lent_the_pool_says_so_and_does_not_wait() {
        let a = Counting::default();
        let pool = StagingPool::new(&a, 1000);
        let _held = pool.take(200).unwrap(); // 800 bytes lent
        let e = pool.take(100).unwrap_err();
        assert_eq!(e, StagingError::Cap { want: 400, cap: 1000, lent: 800 });
        assert!(e.to_string().contains("cap of 1000 bytes"), "{e}");
        assert_eq!(a.made.get(), 1);
    }

    #[test]
    fn a_failed_allocation_is_an_error_and_counts_nothing() {
        let a = Counting::default();
        a.fail.set(true);
        let pool = StagingPool::new(&a, 1 << 20);
        let e = pool.take(10).unwrap_err();
        assert!(matches!(&e, StagingError::Alloc { bytes: 40, reason } if reason.contains("page-locked")), "{e}");
        assert_eq!(pool.stats(), PoolStats::default());
        a.fail.set(false);
        assert!(pool.take(10).is_ok());
    }

    #[test]
    fn a_lease_outliving_its_pool_frees_its_buffer() {
        let pool = StagingPool::new(HeapAlloc, 64);
        let lease = pool.take(64).unwrap();
        drop(pool);
        assert_eq!(lease.len(), 64);
        drop(lease);
    }
}

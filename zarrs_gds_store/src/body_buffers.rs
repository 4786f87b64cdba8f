//! Response bodies gathered into memory that earlier bodies used, not fresh memory: a batch of
//! whole values (hundreds of MB held until decoded) in fresh allocations costs a page fault per
//! 4 KiB, all taken on the thread that gathers the bodies. On the GPU host that doubled the time to
//! fetch Z2's values (run DB in benches/RESULTS.md: 0.32 s held against 0.15 s dropped at once,
//! and 0.13 s where the allocator kept freed memory).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;

/// Bodies smaller than this are left to the allocator, which reuses small blocks by itself.
const SMALLEST: usize = 64 << 10;
/// Bodies larger than this are gathered as they come (a response's claimed length is not
/// allocated up front beyond it), and not kept.
pub(crate) const LARGEST: usize = 64 << 20;

/// Buffers of finished bodies, kept for later ones up to a bound, shared by a store's clones.
#[derive(Clone, Debug)]
pub(crate) struct BodyBuffers(Arc<Kept>);

#[derive(Debug)]
struct Kept {
    /// Free buffers by capacity class.
    free: Mutex<Free>,
    /// The most bytes of capacity kept free.
    limit: usize,
}

#[derive(Debug, Default)]
struct Free {
    by_class: HashMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

/// `len` rounded up to its class, a multiple of an eighth of its next power of two: values of about
/// one size share buffers, and a buffer is less than a quarter longer than its value.
fn class(len: usize) -> usize {
    let step = (len.next_power_of_two() / 8).max(SMALLEST / 4);
    len.div_ceil(step) * step
}

impl BodyBuffers {
    /// Buffers that keep at most `limit` bytes free (0: none kept).
    pub(crate) fn new(limit: usize) -> Self {
        Self(Arc::new(Kept { free: Mutex::new(Free::default()), limit }))
    }

    /// The most bytes kept free.
    pub(crate) fn limit(&self) -> usize {
        self.0.limit
    }

    /// An empty buffer for a body of `len` bytes: a kept one of its class where there is one.
    /// None where `len` is outside the kept sizes (the caller gathers that body itself).
    pub(crate) fn take(&self, len: usize) -> Option<Vec<u8>> {
        if !(SMALLEST..=LARGEST).contains(&len) || self.0.limit == 0 {
            return None;
        }
        let class = class(len);
        let kept = {
            let mut free = self.0.free.lock().unwrap_or_else(PoisonError::into_inner);
            let buf = free.by_class.get_mut(&class).and_then(Vec::pop);
            if let Some(buf) = &buf {
                free.bytes -= buf.capacity();
            }
            buf
        };
        Some(kept.unwrap_or_else(|| Vec::with_capacity(class)))
    }

    /// `body` (from [`Self::take`]) as bytes that give its buffer back when the last of them is
    /// dropped.
    pub(crate) fn freeze(&self, body: Vec<u8>) -> Bytes {
        Bytes::from_owner(Owned { body, home: Arc::downgrade(&self.0) })
    }

    /// Bytes kept free now.
    #[cfg(test)]
    fn free_bytes(&self) -> usize {
        self.0.free.lock().unwrap_or_else(PoisonError::into_inner).bytes
    }
}

impl Kept {
    fn give_back(&self, mut buf: Vec<u8>) {
        let capacity = buf.capacity();
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.bytes + capacity <= self.limit {
            buf.clear();
            free.bytes += capacity;
            free.by_class.entry(capacity).or_default().push(buf);
        }
    }
}

/// A body's buffer, returned to its store's buffers (if they still exist) when dropped.
struct Owned {
    body: Vec<u8>,
    home: Weak<Kept>,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            home.give_back(std::mem::take(&mut self.body));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter_of_the_power_of_two() {
        for len in [SMALLEST, 65_537, 290_000, 300_000, 1 << 20, (1 << 20) + 1, 5_000_000, LARGEST] {
            let c = class(len);
            assert!(c >= len, "{len} -> {c}");
            assert!(c - len < len.next_power_of_two() / 8 + 1, "{len} -> {c}");
            assert_eq!(class(c), c, "a class is its own class");
        }
        // Values of about one size share a class.
        assert_eq!(class(290_000), class(300_000));
    }

    #[test]
    fn a_dropped_body_gives_its_buffer_to_the_next_of_its_class_up_to_the_limit() {
        let buffers = BodyBuffers::new(1 << 20);
        let mut first = buffers.take(300_000).expect("a kept size");
        first.extend(std::iter::repeat_n(7u8, 300_000));
        let pointer = first.as_ptr();
        let bytes = buffers.freeze(first);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(buffers.free_bytes(), 0, "a slice still holds the body");
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        assert_eq!(buffers.free_bytes(), class(300_000));
        let second = buffers.take(290_000).expect("a kept size");
        assert_eq!(second.as_ptr(), pointer, "the same memory again");
        assert!(second.is_empty());
        assert_eq!(buffers.free_bytes(), 0);

        // Past the limit, buffers go back to the allocator.
        let many: Vec<Bytes> = (0..8).map(|_| buffers.freeze(buffers.take(300_000).unwrap())).collect();
        drop(many);
        assert!(buffers.free_bytes() <= 1 << 20);
        assert_eq!(buffers.free_bytes(), (1 << 20) / class(300_000) * class(300_000));

        // Small and huge bodies are not kept; nothing is kept with a limit of 0.
        assert!(buffers.take(1000).is_none());
        assert!(buffers.take(LARGEST + 1).is_none());
        assert!(BodyBuffers::new(0).take(300_000).is_none());
    }

    #[test]
    fn bodies_outlive_their_store() {
        let buffers = BodyBuffers::new(1 << 20);
        let mut body = buffers.take(100_000).unwrap();
        body.resize(100_000, 1);
        let bytes = buffers.freeze(body);
        drop(buffers);
        assert_eq!(bytes.len(), 100_000);
        assert!(bytes.iter().all(|&b| b == 1));
    }
}

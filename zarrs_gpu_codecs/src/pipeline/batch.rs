//! Batch planning for the decoded read, pure and tested on the CPU: how many decoded bytes a
//! batch takes, which chunks go together, which stored ranges are read as one, how many large
//! frames host threads decode beside the device, and buffers that grow to what a batch needs.

use crate::reader::HostReadRequest;
use zarrs_storage::StoreKey;

use crate::config::GpuConfig;
use crate::error::GpuError;
use crate::schedule::LARGE_CHUNK;

/// Stored chunks start at this alignment in the host and device staging when each is read on
/// its own (nvCOMP takes zstd input at any alignment; 256 keeps copies aligned).
pub(crate) const STORED_ALIGN: u64 = 256;
/// Decoded chunks start at this alignment.
pub(crate) const DECODED_ALIGN: u64 = 4096;
/// Stored ranges of one value this close together are read as one (the gap read and dropped):
/// one pread of 64 KiB more costs less than another request.
pub(crate) const COALESCE_GAP: u64 = 64 << 10;

/// The fraction of large chunks decoded on host threads, when set; otherwise the scheduler
/// decides (`schedule.rs`).
pub(crate) fn host_fraction(config: &GpuConfig) -> Option<f64> {
    config.host_decode_fraction()
}

/// Decoded bytes per batch of zstd chunks when the device has room (`free` is the device memory
/// free for the read, None for chains without zstd): nvCOMP runs faster the more chunks a call
/// has. Large frames (one decodes largely serially) take up to 1024 chunks: one batch of 512
/// 16 MiB chunks ran at 13.5 GiB/s, two of 256 at 11. Small chunks take up to 4 GiB unless the
/// staging budget was set: 4096 chunks of 1 MiB per call ran at 39 to 41 GiB/s, 1024 at 33. A
/// batch takes about 5x its decoded bytes, two in flight, hence a twelfth of what is free.
pub(crate) fn batch_budget(staging: u64, staging_set: bool, largest: u64, free: Option<u64>, out_bytes: u64) -> u64 {
    let Some(free) = free else { return staging };
    let room = free.saturating_sub(out_bytes) / 12;
    if largest >= LARGE_CHUNK {
        staging.max((1024 * largest).min(room))
    } else if staging_set {
        staging
    } else {
        staging.max(room.min(SMALL_BATCH))
    }
}

/// The most decoded bytes of a batch of small zstd chunks (see [`batch_budget`]).
const SMALL_BATCH: u64 = 4 << 30;

/// Group chunks of these decoded sizes, in order, into batches of at most `budget` bytes (each
/// size rounded up to the staging alignment); a chunk larger than the budget is a batch alone.
pub(crate) fn batches_by_size(sizes: impl IntoIterator<Item = u64>, budget: u64) -> Vec<Vec<usize>> {
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut used = 0u64;
    for (i, size) in sizes.into_iter().enumerate() {
        // Saturating: a size near 2^64 stays larger than any budget (and any free memory).
        let need = size.checked_next_multiple_of(DECODED_ALIGN).unwrap_or(u64::MAX);
        if batches.is_empty() || used.saturating_add(need) > budget {
            batches.push(Vec::new());
            used = 0;
        }
        batches.last_mut().expect("a batch").push(i);
        used = used.saturating_add(need);
    }
    batches
}

/// Staging offsets and totals stop here: values this large (sparse files, hostile sizes) fit no
/// memory, so the buffer sized to them fails to allocate, while sums of them cannot overflow.
pub(crate) const STAGING_CAP: u64 = u64::MAX / 4;

/// The reads of a batch: stored spans `(key, offset, len)` of one value that lie at most `gap`
/// bytes apart become one request (in offset order), each request landing at an aligned offset of
/// host staging. Returns the requests, per span its request and host offset, and the staging used
/// (offsets and the total capped at [`STAGING_CAP`]). Each span's `offset + len` must fit in u64
/// (checked where spans are made).
pub(crate) fn coalesce(spans: &[(&StoreKey, u64, u64)], gap: u64) -> (Vec<HostReadRequest>, Vec<(usize, u64)>, u64) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| spans[a].0.as_str().cmp(spans[b].0.as_str()).then(spans[a].1.cmp(&spans[b].1)));
    let mut requests: Vec<HostReadRequest> = Vec::new();
    let mut at = vec![(0, 0); spans.len()];
    let mut used = 0u64;
    for i in order {
        let (key, offset, len) = spans[i];
        let joins = requests.last().is_some_and(|r| {
            let end = r.offset + r.len as u64;
            r.key == *key && offset >= end && offset - end <= gap
        });
        if joins {
            let r = requests.last_mut().expect("a request");
            r.len = (offset + len - r.offset) as usize;
        } else {
            if let Some(r) = requests.last() {
                used = (r.at as u64).saturating_add(r.len as u64).min(STAGING_CAP).next_multiple_of(STORED_ALIGN);
            }
            requests.push(HostReadRequest {
                key: key.clone(),
                offset,
                len: len as usize,
                at: used as usize,
                value_len: None,
                version: None,
            });
        }
        let r = requests.last().expect("a request");
        at[i] = (requests.len() - 1, (r.at as u64).saturating_add(offset - r.offset).min(STAGING_CAP));
    }
    let total = requests.last().map_or(0, |r| (r.at as u64).saturating_add(r.len as u64).min(STAGING_CAP));
    (requests, at, total)
}

/// Keep `buffer` at least `len` bytes: a buffer that is too small (or none) is replaced by one a
/// quarter larger than asked, so that batches of slowly growing size do not reallocate each time.
/// The old buffer must no longer be in use. Returns the buffer, and whether it is a new one (its
/// contents are not the old one's, whatever its address).
pub(crate) fn ensure<B>(
    buffer: &mut Option<B>,
    len: u64,
    capacity: impl Fn(&B) -> usize,
    take: impl Fn(usize) -> Result<B, GpuError>,
    give: impl Fn(B),
) -> Result<(&mut B, bool), GpuError> {
    let grow = match buffer.take() {
        Some(fits) if capacity(&fits) as u64 >= len => return Ok((buffer.insert(fits), false)),
        Some(old) => {
            give(old);
            true
        }
        None => false,
    };
    let len = if grow { len.saturating_add(len / 4) } else { len };
    Ok((buffer.insert(take(len.max(1) as usize)?), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuConfig;

    #[test]
    fn batches_respect_the_budget_in_order() {
        let k = DECODED_ALIGN;
        let batches = batches_by_size([3 * k, 3 * k, 3 * k, 10 * k, k, 1], 6 * k);
        assert_eq!(batches, vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
        assert_eq!(batches_by_size([], k), Vec::<Vec<usize>>::new());
        // Sizes round up to the alignment: two odd sizes of just over half a budget do not share.
        assert_eq!(batches_by_size([k + 1, k + 1], 3 * k), vec![vec![0], vec![1]]);
        // Sizes near 2^64 neither overflow nor share a batch; with a budget as large they do
        // share one (whose size saturates, more than any device has free).
        assert_eq!(batches_by_size([u64::MAX - 1, u64::MAX - 1, 1], 1 << 30), vec![vec![0], vec![1], vec![2]]);
        assert_eq!(batches_by_size([u64::MAX - 1, u64::MAX - 1, 1], u64::MAX), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn adjacent_ranges_of_one_value_become_one_read() {
        let (a, b) = (StoreKey::new("c/0").unwrap(), StoreKey::new("c/1").unwrap());
        // Out of order; a[0..100] and a[100..150] touch, a[150 + 10..] is within the gap, b apart.
        let spans = [(&a, 100, 50), (&b, 0, 10), (&a, 0, 100), (&a, 160, 40), (&a, 10_000, 5)];
        let (requests, at, total) = coalesce(&spans, 64);
        let got: Vec<(&str, u64, usize, u64)> =
            requests.iter().map(|r| (r.key.as_str(), r.offset, r.len, r.at as u64)).collect();
        assert_eq!(got, vec![("c/0", 0, 200, 0), ("c/0", 10_000, 5, 256), ("c/1", 0, 10, 512)]);
        assert_eq!(at, vec![(0, 100), (2, 512), (0, 0), (0, 160), (1, 256)]);
        assert_eq!(total, 522);
        // Overlapping ranges (a shard whose index points twice into the same bytes) read apart.
        let (requests, at, _) = coalesce(&[(&a, 0, 100), (&a, 50, 100)], 64);
        assert_eq!(requests.len(), 2);
        assert_eq!(at, vec![(0, 0), (1, 256)]);
        assert_eq!(coalesce(&[], 64).2, 0);
        // Values too large for any memory: offsets and the total stop at the cap, no overflow.
        let huge = u64::MAX - 10;
        let (requests, at, total) = coalesce(&[(&a, 0, huge), (&b, 0, huge), (&b, 1 << 40, 10)], 64);
        assert_eq!(requests.len(), 3);
        assert_eq!(total, STAGING_CAP);
        assert!(at.iter().all(|&(_, offset)| offset <= STAGING_CAP + STORED_ALIGN));
    }

    #[test]
    fn batches_grow_with_free_memory_for_zstd() {
        let gib = 1u64 << 30;
        let staging = gib;
        // No zstd (no memory query): the staging budget.
        assert_eq!(batch_budget(staging, false, 1 << 20, None, 8 * gib), staging);
        // Small frames: up to 4 GiB where a twelfth of the room allows, unless a budget is set.
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(100 * gib), 8 * gib), 4 * gib);
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(32 * gib), 8 * gib), 2 * gib);
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(9 * gib), 8 * gib), staging);
        assert_eq!(batch_budget(staging, true, 1 << 20, Some(100 * gib), 8 * gib), staging);
        // 16 MiB frames with plenty of room: 1024 of them.
        assert_eq!(batch_budget(staging, false, 16 << 20, Some(300 * gib), 8 * gib), 16 * gib);
        // Little room: a twelfth of what the output leaves, never less than the staging budget.
        assert_eq!(batch_budget(staging, true, 16 << 20, Some(32 * gib), 8 * gib), 2 * gib);
        assert_eq!(batch_budget(staging, false, 16 << 20, Some(9 * gib), 8 * gib), staging);
    }

    #[test]
    fn set_host_fractions_are_clamped() {
        let config = GpuConfig::default();
        assert_eq!(host_fraction(&config.clone().with_host_decode_fraction(Some(0.2))), Some(0.2));
        assert_eq!(host_fraction(&config.clone().with_host_decode_fraction(Some(3.0))), Some(1.0));
        assert_eq!(host_fraction(&config.with_host_decode_fraction(Some(-1.0))), Some(0.0));
    }
}

//! Where a batch's device metadata lies: every array its kernels read or write, at offsets from
//! the start of the slot's metadata region (the pinned host mirror of that region uses the same
//! offsets). One place computes them; the planner sizes the region with the same function, for
//! every unit of the batch on every path, so the layout of fewer units always fits.

use crate::pipeline::place;

/// Offsets (bytes from the start of the metadata region) of a batch's arrays: crc32c of
/// `crc` stored units, decoding of `dec` units, their results, the placement tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MetaLayout {
    /// Units whose stored bytes carry a crc32c, and units decoded on the device.
    pub(crate) crc: usize,
    pub(crate) dec: usize,
    /// Whether the results hold digests (a value and a status per decoded unit).
    pub(crate) digests: bool,
    /// Gather jobs and strided copies the placement tables have room for.
    gather_jobs: usize,
    copies: usize,
}

impl MetaLayout {
    pub(crate) fn new(crc: usize, dec: usize, digests: bool, gather_jobs: usize, copies: usize) -> Self {
        Self { crc, dec, digests, gather_jobs, copies }
    }

    /// crc32c: input pointers, input sizes (u64 each), then the computed values and their
    /// statuses (u32 each), contiguous for one copy back.
    pub(crate) const CRC_INPUTS: u64 = 0;

    pub(crate) fn crc_sizes(&self) -> u64 {
        8 * self.crc as u64
    }

    pub(crate) fn crc_values(&self) -> u64 {
        16 * self.crc as u64
    }

    pub(crate) fn crc_statuses(&self) -> u64 {
        20 * self.crc as u64
    }

    /// Decoding: input pointers, input sizes, output capacities, output pointers (u64 each).
    pub(crate) fn dec_arrays(&self) -> u64 {
        (24 * self.crc as u64).next_multiple_of(8)
    }

    /// The decode results, contiguous for one copy back: decoded sizes (u64), statuses (u32),
    /// and with digests their values and statuses (u32 each).
    pub(crate) fn results(&self) -> u64 {
        self.dec_arrays() + 32 * self.dec as u64
    }

    pub(crate) fn statuses(&self) -> u64 {
        self.results() + 8 * self.dec as u64
    }

    pub(crate) fn digest_values(&self) -> u64 {
        self.statuses() + 4 * self.dec as u64
    }

    pub(crate) fn digest_statuses(&self) -> u64 {
        self.digest_values() + 4 * self.dec as u64
    }

    /// Bytes of the results.
    pub(crate) fn result_bytes(&self) -> u64 {
        self.dec as u64 * if self.digests { 20 } else { 12 }
    }

    /// Whether the placement tables have room for `gather_jobs` jobs and `copies` table entries:
    /// checked before they are staged, since past their room they would overwrite the next array
    /// (or past the region, memory the kernels must never see).
    pub(crate) fn holds_tables(&self, gather_jobs: usize, copies: usize) -> bool {
        gather_jobs <= self.gather_jobs && copies <= self.copies
    }

    /// The gather kernel's jobs.
    pub(crate) fn gather(&self) -> u64 {
        (self.results() + self.result_bytes()).next_multiple_of(8)
    }

    /// The strided-copy kernel's table.
    pub(crate) fn copies(&self) -> u64 {
        self.gather() + place::gather_table_bytes(self.gather_jobs) as u64
    }

    /// Bytes of the whole region (a multiple of 256, so that what follows stays aligned).
    pub(crate) fn len(&self) -> u64 {
        (self.copies() + place::table_bytes(self.copies) as u64).next_multiple_of(256)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_aligned_disjoint_and_fewer_units_fit_the_bound() {
        for (n, gather, copies) in [(1usize, 0usize, 1usize), (7, 7, 0), (1000, 0, 3000), (4096, 4096, 4096)] {
            let bound = MetaLayout::new(n, n, true, gather, copies);
            for (crc, dec, digests) in [(n, n, true), (0, n, false), (n / 2, n / 3, true), (0, 0, false)] {
                let l = MetaLayout::new(crc, dec, digests, gather, copies);
                assert!(l.len() <= bound.len(), "{l:?} over {bound:?}");
                let spans = [
                    (MetaLayout::CRC_INPUTS, 8 * crc as u64),
                    (l.crc_sizes(), 8 * crc as u64),
                    (l.crc_values(), 4 * crc as u64),
                    (l.crc_statuses(), 4 * crc as u64),
                    (l.dec_arrays(), 32 * dec as u64),
                    (l.results(), 8 * dec as u64),
                    (l.statuses(), 4 * dec as u64),
                    (l.digest_values(), if digests { 4 * dec as u64 } else { 0 }),
                    (l.digest_statuses(), if digests { 4 * dec as u64 } else { 0 }),
                    (l.gather(), place::gather_table_bytes(gather) as u64),
                    (l.copies(), place::table_bytes(copies) as u64),
                ];
                let used: Vec<(u64, u64)> = spans.iter().copied().filter(|s| s.1 > 0).collect();
                for w in used.windows(2) {
                    assert!(w[0].0 + w[0].1 <= w[1].0, "{l:?}: {w:?} overlap");
                }
                assert!(spans.last().map(|s| s.0 + s.1).unwrap() <= l.len());
                for (at, _) in [spans[0], spans[1], spans[4], spans[5], spans[9], spans[10]] {
                    assert_eq!(at % 8, 0, "{l:?}: u64 arrays 8-byte aligned");
                }
                assert_eq!(l.statuses() - l.results(), 8 * dec as u64);
            }
        }
    }
}

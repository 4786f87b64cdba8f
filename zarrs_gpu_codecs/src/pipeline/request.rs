//! A request: the subsets one retrieval reads and where each one's elements land in the output.
//! A chunk (or inner chunk) that several subsets meet becomes one unit, read and decoded once and
//! placed wherever the request needs it.

use std::collections::HashMap;

use zarrs::array::ArraySubset;

use crate::error::GpuError;
use crate::pipeline::plan::{checked_bytes, ChunkPlacement};
use crate::pipeline::unit::Unit;

/// Each subset's output of a request that is not stacked starts at a multiple of this many bytes
/// (CUDA's allocation alignment is 256): the arrays handed out are as aligned as separate ones.
pub(crate) const PART_ALIGN: u64 = 256;

/// How a request lays its subsets' outputs out in its one output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One after another with no gap: an array of shape `(n, *shape)` when the shapes agree.
    Stacked,
    /// Each at a multiple of [`PART_ALIGN`] bytes.
    Aligned,
}

/// The subsets of one retrieval and where their outputs lie in its output.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) subsets: Vec<ArraySubset>,
    /// Where each subset's elements start in the output, in bytes.
    pub(crate) bases: Vec<u64>,
    /// Each subset's bytes.
    pub(crate) lens: Vec<u64>,
    /// The output's bytes: the last subset's end.
    pub(crate) out_bytes: u64,
}

impl Request {
    /// `subsets` of elements of `elem` bytes, laid out as `layout` says; sizes checked.
    pub(crate) fn new(subsets: &[ArraySubset], elem: u64, layout: Layout) -> Result<Self, GpuError> {
        let mut bases = Vec::with_capacity(subsets.len());
        let mut lens = Vec::with_capacity(subsets.len());
        let mut at = 0u64;
        let overflow = || GpuError::Overflow(format!("the {} subsets' bytes overflow u64", subsets.len()));
        for subset in subsets {
            let len = checked_bytes(subset.shape(), elem)
                .ok_or_else(|| GpuError::bytes_overflow("the subset of shape", subset.shape(), elem))?;
            if layout == Layout::Aligned {
                at = at.checked_next_multiple_of(PART_ALIGN).ok_or_else(overflow)?;
            }
            bases.push(at);
            lens.push(len);
            at = at.checked_add(len).ok_or_else(overflow)?;
        }
        Ok(Self { subsets: subsets.to_vec(), bases, lens, out_bytes: at })
    }

    /// Each subset with where its output starts.
    pub(crate) fn parts(&self) -> impl Iterator<Item = (&ArraySubset, u64)> {
        self.subsets.iter().zip(self.bases.iter().copied())
    }
}

/// The placements of every subset of a request (each already shifted to its subset's output),
/// one per chunk: those of a chunk met by several subsets merged into the first
/// ([`ChunkPlacement::absorb`]), in the order the chunks were first met.
pub(crate) fn merge_placements(placements: Vec<ChunkPlacement>) -> Result<Vec<ChunkPlacement>, GpuError> {
    let mut at: HashMap<Vec<u64>, usize> = HashMap::with_capacity(placements.len());
    let mut merged: Vec<ChunkPlacement> = Vec::with_capacity(placements.len());
    for placement in placements {
        if let Some(&i) = at.get(&placement.chunk_indices) {
            merged[i].absorb(placement)?;
        } else {
            at.insert(placement.chunk_indices.clone(), merged.len());
            merged.push(placement);
        }
    }
    Ok(merged)
}

/// The units of every subset of a sharded request, one per inner chunk: those of an inner chunk
/// met by several subsets merged, as [`merge_placements`]. Each is still a whole inner chunk
/// (not narrowed, read as stored), so the same inner chunk has the same source in each.
pub(crate) fn merge_units(units: Vec<Unit>) -> Result<Vec<Unit>, GpuError> {
    let mut at: HashMap<(zarrs_storage::StoreKey, Option<Vec<u64>>), usize> = HashMap::with_capacity(units.len());
    let mut merged: Vec<Unit> = Vec::with_capacity(units.len());
    for unit in units {
        if unit.narrowed || unit.rows.is_some() || unit.direct.is_some() {
            return Err(unit.error("only units read whole merge across subsets"));
        }
        let key = (unit.placement.key.clone(), unit.inner.clone());
        if let Some(&i) = at.get(&key) {
            let held = &mut merged[i];
            if held.source != unit.source || held.value_len != unit.value_len {
                return Err(unit.error("its shard index gave two sources in one request"));
            }
            held.placement.absorb(unit.placement)?;
        } else {
            at.insert(key, merged.len());
            merged.push(unit);
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plan::plan_chunks;
    use zarrs_storage::StoreKey;

    /// A 3-D array of u16 in chunks, its values their own linear index.
    fn chunks_of(shape: &[u64], chunk: &[u64]) -> Vec<(Vec<u64>, StoreKey, ArraySubset)> {
        let grid: Vec<u64> = shape.iter().zip(chunk).map(|(n, c)| n.div_ceil(*c)).collect();
        ArraySubset::new_with_shape(grid)
            .indices()
            .into_iter()
            .map(|idx| {
                let start: Vec<u64> = idx.iter().zip(chunk).map(|(i, c)| i * c).collect();
                let key = StoreKey::new(format!("c/{}", idx.iter().map(u64::to_string).collect::<Vec<_>>().join("/")))
                    .unwrap();
                (idx.to_vec(), key, ArraySubset::new_with_start_shape(start, chunk.to_vec()).unwrap())
            })
            .collect()
    }

    fn value(at: &[u64], shape: &[u64]) -> u16 {
        at.iter().zip(shape).fold(0u64, |acc, (i, n)| acc * n + i) as u16
    }

    /// A chunk's decoded bytes: its elements' values, zero past the array's edge.
    fn decoded(chunk: &ArraySubset, shape: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        for idx in &chunk.indices() {
            let inside = idx.iter().zip(shape).all(|(i, n)| i < n);
            out.extend(if inside { value(&idx, shape) } else { 0 }.to_ne_bytes());
        }
        out
    }

    #[test]
    fn chunks_met_by_several_subsets_are_read_once_and_placed_into_each() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(28);
        let shape = [9u64, 20, 13];
        let chunk = [4u64, 6, 5];
        for layout in [Layout::Stacked, Layout::Aligned] {
            for _ in 0..60 {
                // Crops overlapping each other and the edges, some empty, some repeated.
                let n = rng.random_range(1..6);
                let mut subsets: Vec<ArraySubset> = (0..n)
                    .map(|_| {
                        let ranges: Vec<_> = shape
                            .iter()
                            .map(|&s| {
                                let a = rng.random_range(0..s);
                                a..rng.random_range(a..=s)
                            })
                            .collect();
                        ArraySubset::new_with_ranges(&ranges)
                    })
                    .collect();
                if n > 1 && rng.random_bool(0.3) {
                    subsets[n - 1] = subsets[0].clone();
                }
                let request = Request::new(&subsets, 2, layout).unwrap();
                let mut placements = Vec::new();
                let mut unmerged = 0;
                for (subset, base) in request.parts() {
                    let meeting: Vec<_> = chunks_of(&shape, &chunk)
                        .into_iter()
                        .filter(|(_, _, c)| c.overlap(subset).is_ok_and(|o| !o.is_empty()))
                        .collect();
                    for mut p in plan_chunks(2, subset, meeting).unwrap() {
                        p.shift_output(base).unwrap();
                        placements.push(p);
                        unmerged += 1;
                    }
                }
                let merged = merge_placements(placements).unwrap();
                let distinct: std::collections::HashSet<_> = merged.iter().map(|p| p.key.clone()).collect();
                assert_eq!(distinct.len(), merged.len(), "a chunk is one placement");
                assert!(merged.len() <= unmerged);
                let mut out = vec![0xAAu8; request.out_bytes as usize];
                for p in &merged {
                    let chunk_subset = chunks_of(&shape, &chunk).into_iter().find(|c| c.1 == p.key).unwrap().2;
                    let bytes = decoded(&chunk_subset, &shape);
                    let read = &bytes[p.byte_start as usize..p.byte_end as usize];
                    for c in &p.copies {
                        assert!(c.src_end() <= p.read_len());
                        c.apply_host(read, &mut out);
                    }
                }
                for (i, (subset, base)) in request.parts().enumerate() {
                    if layout == Layout::Aligned {
                        assert_eq!(base % PART_ALIGN, 0);
                    }
                    let mut want = Vec::new();
                    for idx in &subset.indices() {
                        want.extend(value(&idx, &shape).to_ne_bytes());
                    }
                    let got = &out[base as usize..(base + request.lens[i]) as usize];
                    assert_eq!(got, want.as_slice(), "subset {i} {subset:?} of {subsets:?}");
                }
            }
        }
    }

    #[test]
    fn stacked_outputs_follow_each_other_and_sizes_are_checked() {
        let subsets = vec![ArraySubset::new_with_ranges(&[0..3, 1..5]); 4];
        let stacked = Request::new(&subsets, 8, Layout::Stacked).unwrap();
        assert_eq!(stacked.bases, vec![0, 96, 192, 288]);
        assert_eq!(stacked.out_bytes, 384);
        let odd = vec![ArraySubset::new_with_ranges(&[0..1, 0..3]); 3];
        let aligned = Request::new(&odd, 2, Layout::Aligned).unwrap();
        assert_eq!(aligned.bases, vec![0, 256, 512]);
        assert_eq!(aligned.out_bytes, 518);
        let huge = ArraySubset::new_with_start_shape(vec![0, 0], vec![1 << 40, 1 << 20]).unwrap();
        assert!(matches!(Request::new(&[huge.clone(), huge], 8, Layout::Stacked), Err(GpuError::Overflow(_))));
    }
}

//! Placement: a batch's decoded chunks (or stored bytes, or the fill block) into the output, by
//! one kernel launch per batch, or element by element by the gather kernel.

use super::device::Layout;
use super::job::{Job, Route};
use super::memory::ReadMemory;
use super::read::Batch;
use crate::codecs;
use crate::error::GpuError;
use crate::pipeline::place::{self, copy_dtod};
use crate::pipeline::plan::PlacementPart;
use crate::pipeline::route::DeviceChain;
use crate::report::RetrieveReport;

impl Batch {
    /// Placement: every copy of the batch in one kernel launch (or by the copy engines without
    /// NVRTC); transposed or byte-swapped chunks element by element, by the gather kernel; missing
    /// units from the fill block (made at the first).
    pub(super) fn place(
        &self,
        job: &Job<'_>,
        layout: &Layout,
        memory: &mut ReadMemory<'_>,
        report: &mut RetrieveReport,
    ) -> Result<(), GpuError> {
        let out_ptr = job.out.ptr()?;
        let (units, chain, stream) = (job.units, job.chain, job.stream);
        if let Some(delta) = &chain.delta {
            // numcodecs' delta: each whole decoded chunk (never narrowed: not raw) summed in place.
            let chunks: Vec<(u64, u64)> = (self.items.iter().filter(|it| it.route != Route::Missing))
                .map(|it| match chain.compression {
                    Some(_) => (layout.dbase + it.decoded_offset, job.decoded_len(it.unit)),
                    None => (layout.cbase + it.host_offset, job.decoded_len(it.unit)),
                })
                .collect();
            // SAFETY: the chunks' decoded bytes in this batch's staging, ordered on the stream.
            unsafe { codecs::delta::kernels::launch_delta_scan(job.kernels, stream, *delta, &chunks) }?;
        }
        let mut copies = Vec::new();
        let mut srcs = Vec::new();
        let mut jobs = Vec::new();
        for it in &self.items {
            let p = &units[it.unit].placement;
            let base = if chain.compression.is_some() {
                layout.dbase + it.decoded_offset
            } else {
                layout.cbase + it.host_offset
            };
            let src = match it.route {
                Route::Missing => {
                    report.missing_chunks += 1;
                    memory.fill(job.fill_value, job.fill_len, stream)?
                }
                // Read straight into the output: placed already.
                _ if units[it.unit].direct.is_some() => continue,
                _ if chain.needs_gather() => {
                    jobs.extend(p.parts.iter().map(|part| gather_job(chain, job.elem, &p.chunk_shape, part, base)));
                    continue;
                }
                // A narrowed read starts at byte_start.
                _ if units[it.unit].narrowed => base,
                _ => base + p.byte_start,
            };
            copies.extend_from_slice(&p.copies);
            srcs.extend(std::iter::repeat_n(src, p.copies.len()));
        }
        // Planned from the same units (`table_room`); a miss here is this crate's bug, refused
        // before it could write past the tables.
        // Rows past MAX_ROW become several entries (the table has room: `table_room`).
        let split = job.kernels.map(|_| place::split_rows(&copies, &srcs, place::MAX_ROW));
        let entries = split.as_ref().map_or(0, |(entries, _)| entries.len());
        if !layout.arrays.holds_tables(jobs.len(), entries) {
            return Err(GpuError::Unsupported(format!(
                "a batch's placement needs {} gather jobs and {entries} copies, more than its metadata was planned for",
                jobs.len()
            )));
        }
        if !jobs.is_empty() {
            let placer = job
                .kernels
                .ok_or_else(|| GpuError::NoNvrtc("placing transposed or byte-swapped chunks needs it".into()))?;
            let at = layout.arrays.gather();
            layout.stage(at, &place::encode_gather(&jobs), stream.as_ref())?;
            // SAFETY: each job stays within its decoded chunk and `out` (planned from both shapes).
            unsafe { placer.launch_gather(stream, layout.at(at), &jobs, out_ptr) }?;
        }
        if let (Some(placer), Some((copies, srcs))) = (job.kernels, split) {
            let table = place::encode(&copies, &srcs);
            let at = layout.arrays.copies();
            layout.stage(at, &table, stream.as_ref())?;
            // SAFETY: copies stay within their decoded chunks (or the fill block) and `out`.
            unsafe { placer.launch(stream, layout.at(at), &copies, out_ptr) }?;
        } else {
            for (copy, &src) in copies.iter().zip(&srcs) {
                // SAFETY: as above.
                unsafe { copy_dtod(copy, src, out_ptr, stream) }?;
            }
        }
        Ok(())
    }
}

/// The gather job placing `part` of a chunk of `shape` decoded at `base` (its elements in the
/// chunk's stored layout: C order of its transpose, if any) into its subset's output.
fn gather_job(chain: &DeviceChain, elem: u64, shape: &[u64], part: &PlacementPart, base: u64) -> place::Gather {
    let src_stride = place::stored_strides(chain.transpose.as_deref(), shape, elem);
    let dst_stride = place::stored_strides(None, &part.output_shape, elem);
    let dot = |start: &[u64], strides: &[u64]| start.iter().zip(strides).map(|(a, b)| a * b).sum::<u64>();
    place::Gather {
        src: base + dot(part.chunk_region.start(), &src_stride),
        dst: part.output_base + dot(part.output_region.start(), &dst_stride),
        elem,
        swap: chain.swap,
        extent: part.chunk_region.shape().to_vec(),
        src_stride,
        dst_stride,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plan::plan_chunks;
    use zarrs::array::ArraySubset;
    use zarrs_storage::StoreKey;

    /// What the gather kernel does, on the host.
    fn apply_gather(job: &place::Gather, src: &[u8], out: &mut [u8]) {
        let count: u64 = job.extent.iter().product();
        for i in 0..count {
            let (mut rest, mut s, mut d) = (i, job.src, job.dst);
            for k in (0..job.extent.len()).rev() {
                let x = rest % job.extent[k];
                rest /= job.extent[k];
                s += x * job.src_stride[k];
                d += x * job.dst_stride[k];
            }
            for w in (0..job.elem).step_by(job.swap.max(1) as usize) {
                let word = job.swap.max(1);
                for b in 0..word {
                    let from = if job.swap > 1 { w + word - 1 - b } else { w + b };
                    out[(d + w + b) as usize] = src[(s + from) as usize];
                }
            }
        }
    }

    #[test]
    fn gather_jobs_undo_transposes_and_byte_order() {
        // A 2 x 3 x 4 chunk of u16 at [4, 0, 0] of the array, stored transposed by [2, 0, 1]
        // and big-endian; the subset [5..6, 1..3, 1..4] of an output of shape [2, 3, 4] at [4, 0, 0].
        let shape = [2u64, 3, 4];
        let value = |z: u64, y: u64, x: u64| (z * 100 + y * 10 + x) as u16 + 0x0100;
        let mut stored = Vec::new();
        for x in 0..4 {
            for z in 0..2 {
                for y in 0..3 {
                    stored.extend(value(z, y, x).to_be_bytes());
                }
            }
        }
        let subset = ArraySubset::new_with_ranges(&[5..6, 1..3, 1..4]);
        let out_subset = ArraySubset::new_with_ranges(&[4..6, 0..3, 0..4]);
        let chunk = ArraySubset::new_with_start_shape(vec![4, 0, 0], shape.to_vec()).unwrap();
        let key = StoreKey::new("c").unwrap();
        let p = plan_chunks(2, &out_subset, [(vec![0, 0, 0], key, chunk)]).unwrap().pop().unwrap();
        let part = PlacementPart {
            chunk_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            output_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            ..p.parts[0].clone()
        };
        let chain = DeviceChain { swap: 2, transpose: Some(vec![2, 0, 1]), ..DeviceChain::default() };
        let job = gather_job(&chain, 2, &p.chunk_shape, &part, 0);
        let mut out = vec![0u8; 2 * 24];
        apply_gather(&job, &stored, &mut out);
        for z in 0..2u64 {
            for y in 0..3u64 {
                for x in 0..4u64 {
                    let i = ((z * 3 + y) * 4 + x) as usize * 2;
                    let got = u16::from_ne_bytes([out[i], out[i + 1]]);
                    let inside = z == 1 && (1..3).contains(&y) && (1..4).contains(&x);
                    assert_eq!(got, if inside { value(z, y, x) } else { 0 }, "at {z} {y} {x}");
                }
            }
        }
    }
}

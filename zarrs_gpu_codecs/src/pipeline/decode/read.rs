//! The read stage: a batch's stored sizes, its reads planned (coalesced ranges, rows, reads
//! straight into the output) and made from the read's source, into pinned memory mirrored to the
//! device or straight into device memory.

use zarrs_storage::{Bytes, StoreKey};

use super::budget::meta_len;
use super::job::{Item, Job, Route};
use super::memory::ReadMemory;
use crate::error::GpuError;
use crate::pipeline::batch::{coalesce, COALESCE_GAP, DECODED_ALIGN, STORED_ALIGN};
use crate::pipeline::unit::{max_stored_len, Source, Unit};
use crate::reader::{DeviceMirror, DeviceReadRequest, DeviceRowsRequest, HostReadRequest, Prefetched};
use crate::report::RetrieveReport;

/// Per unit its stored `(offset, length)` (None: missing), and the values fetched while sizing.
type Spans = (Vec<Option<(u64, u64)>>, Prefetched);

/// The whole values among `batch`'s units (in batch order), each with the most stored bytes its
/// unit may take (`check_stored_len`).
pub(super) fn whole_values<'u>(units: &'u [Unit], batch: &[usize]) -> Vec<(&'u StoreKey, u64)> {
    batch
        .iter()
        .filter(|&&u| units[u].source == Source::Whole)
        .map(|&u| (&units[u].placement.key, max_stored_len(units[u].decoded_len())))
        .collect()
}

/// The stored (offset, length) of each unit of `batch`, None when missing: whole values are
/// sized here, batch by batch, so that later batches' queries overlap the device's work on
/// earlier ones. `fetched`: the batch's whole values, fetched ahead ([`whole_values`]' order).
fn stored_spans(job: &Job<'_>, batch: &[usize], fetched: Option<Vec<Option<Bytes>>>) -> Result<Spans, GpuError> {
    let units = job.units;
    let whole = whole_values(units, batch);
    let (sizes, prefetched) =
        job.source.sizes(job.context.reader(), &whole, fetched).map_err(|e| GpuError::Array(e.into()))?;
    let mut sizes = sizes.into_iter();
    let spans = batch
        .iter()
        .map(|&u| match units[u].source {
            Source::Whole => {
                sizes.next().expect("a size per whole unit").map(|len| whole_span(&units[u], len)).transpose()
            }
            Source::Range { offset, len } => Ok(Some((offset, len))),
            Source::Missing => Ok(None),
        })
        .collect::<Result<_, GpuError>>()?;
    Ok((spans, prefetched))
}

/// The span of `unit`'s whole value of `len` bytes, its size checked as soon as it is learned,
/// before any buffer is sized to it.
fn whole_span(unit: &Unit, len: u64) -> Result<(u64, u64), GpuError> {
    crate::pipeline::unit::check_stored_len(len, unit.decoded_len()).map_err(|reason| unit.error(reason))?;
    Ok((0, len))
}

/// A batch in progress, stage by stage: its units' reads and items, where it lies in its slot.
pub(super) struct Batch {
    /// Its place among the read's batches.
    pub(super) index: usize,
    /// The slot whose buffers it uses.
    pub(super) slot: usize,
    /// Its reads: the first `staged` land in the slot's staging at their `at`, the rest straight
    /// into the output at theirs.
    requests: Vec<HostReadRequest>,
    staged: usize,
    /// Per stored unit in batch order, its read and staging offset.
    at: Vec<(ReadOf, u64)>,
    /// The rows of units read as rows ([`Reads::rows`]).
    rows: Vec<DeviceRowsRequest>,
    pub(super) stored_total: u64,
    pub(super) decoded_total: u64,
    pub(super) items: Vec<Item>,
    /// Device memory its metadata may take ([`meta_len`]).
    pub(super) meta_bytes: u64,
    /// Where the metadata staging starts in the slot's pinned buffer; set by [`Batch::read`].
    pub(super) host_meta_at: u64,
    /// Values fetched whole while the batch was sized (a remote store's), dropped once read.
    prefetched: Prefetched,
}

impl Batch {
    /// The batch of `units` (`index`, in `slot`): its stored sizes and its reads (`fetched`: its
    /// whole values, fetched ahead).
    pub(super) fn plan(
        job: &Job<'_>,
        units: &[usize],
        (index, slot): (usize, usize),
        fetched: Option<Vec<Option<Bytes>>>,
    ) -> Result<Self, GpuError> {
        let (spans, prefetched) = stored_spans(job, units, fetched)?;
        let Reads { requests, staged, at, rows, stored_total, items, decoded_total } =
            plan_reads(job.units, units, &spans);
        let meta_bytes = meta_len(job.units, job.chain, units);
        Ok(Batch {
            index,
            slot,
            requests,
            staged,
            at,
            rows,
            stored_total,
            decoded_total,
            items,
            meta_bytes,
            host_meta_at: 0,
            prefetched,
        })
    }

    /// Read the batch's stored bytes: into the slot's pinned buffer, where they are checked, each
    /// piece copied on to the slot's device staging as soon as it is read (the copy stream waits
    /// for those copies), or (chains with nothing to check) straight into the device staging
    /// (GdsStore: cuFile where native GDS works). Units whose value disappeared since it was
    /// sized become missing. Returns the slot's pinned buffer (the stored bytes, when checked).
    pub(super) fn read<'b>(
        &mut self,
        job: &Job<'_>,
        memory: &'b mut ReadMemory<'_>,
        report: &mut RetrieveReport,
    ) -> Result<&'b [u8], GpuError> {
        let (chain, config) = (job.chain, job.config);
        let (stored_total, meta_bytes) = (self.stored_total, self.meta_bytes);
        // Room for the batch as if every stored unit decoded on the device: the stored bytes
        // are copied to the staging while they are read, before the host check routes them.
        let may_decode = chain.device_may_decode(config.decode_trust());
        let stored = self.items.iter().filter(|it| it.route != Route::Missing && may_decode);
        let staging = job.staging(stored, stored_total, self.decoded_total, meta_bytes)?.len;
        let (context, requests, staged) = (job.context, self.requests.as_slice(), self.staged);
        let direct = !chain.is_checked();
        let prefetched = std::mem::take(&mut self.prefetched);
        // The host keeps only the metadata staging when the bytes go straight to the device.
        let host_meta_at = if direct { 0 } else { stored_total.next_multiple_of(STORED_ALIGN) };
        let cbase = memory.staging(self.slot, staging)?.ptr;
        let hbuf = memory.pinned(self.slot, host_meta_at + meta_bytes)?;
        let found = if direct {
            let out_ptr = if staged < requests.len() { job.out.ptr()? } else { 0 };
            let base = |i: usize| if i < staged { cbase } else { out_ptr };
            let requests: Vec<DeviceReadRequest> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| DeviceReadRequest {
                    key: r.key.clone(),
                    offset: r.offset,
                    len: r.len,
                    dst: base(i) + r.at as u64,
                    value_len: r.value_len,
                    version: r.version.clone(),
                })
                .collect();
            // SAFETY: each staged request lands at its offset below stored_total in the slot's
            // staging, which has room for stored_total bytes; coalesced requests do not overlap; the
            // slot's previous batch has finished (its event, awaited before this batch). The others
            // land on the disjoint runs of the output their chunks' placements name.
            let outcome = unsafe {
                job.source.to_device(context.reader(), &requests, config.backend(), Some(job.copy_stream), &prefetched)
            }?;
            report.io = Some(outcome.status);
            outcome.found
        } else {
            debug_assert!(self.rows.is_empty(), "checked chains read no units as rows");
            debug_assert_eq!(staged, requests.len(), "checked chains read nothing straight into the output");
            let hbuf = &mut hbuf.as_mut_slice()[..stored_total as usize];
            // SAFETY: the slot's staging starts with room for stored_total bytes, and its previous
            // batch has finished (its event, awaited before this batch); the pinned host buffer is
            // reused only after this batch's event, which follows the copy stream's wait for the copies.
            let mirror = Some(unsafe { DeviceMirror::new(cbase, stored_total as usize, job.copy_stream) });
            job.source.to_host(context.reader(), requests, hbuf, mirror, &prefetched)?
        };
        report.bytes_read += requests.iter().zip(&found).filter(|(_, &f)| f).map(|(r, _)| r.len as u64).sum::<u64>();
        let rows_found = Self::read_rows(&mut self.rows, job, cbase)?;
        if !self.rows.is_empty() {
            // Rows are read only where the store's device reads take preads: the path is that, and
            // the reason names both kinds of read when there were ranges too.
            const ROWS: &str = "rows of uncompressed chunks read with preadv into pinned memory, copied to the device";
            let reason = match report.io.take() {
                Some(io) if !requests.is_empty() => format!("{ROWS}; other ranges: {}", io.reason),
                _ => ROWS.to_string(),
            };
            report.io = Some(zarrs_gds_store::IoStatus::new(zarrs_gds_store::IoPath::Posix, reason));
        }
        report.bytes_read +=
            self.rows.iter().zip(&rows_found).filter(|(_, &f)| f).map(|(r, _)| r.packed_len()).sum::<u64>();
        let mut next_span = self.at.iter();
        for it in self.items.iter_mut().filter(|it| it.route != Route::Missing) {
            let present = match &next_span.next().expect("one per span").0 {
                ReadOf::Request(r) => found[*r],
                ReadOf::Rows(rows) => {
                    let found = &rows_found[rows.clone()];
                    if found.iter().any(|&f| f != found[0]) {
                        return Err(job.units[it.unit].error("its value disappeared while its rows were read"));
                    }
                    found.first().copied().unwrap_or(true)
                }
            };
            if !present {
                it.route = Route::Missing; // deleted between the size query and the read
            }
        }
        self.host_meta_at = host_meta_at;
        Ok(hbuf.as_slice())
    }

    /// Read `rows` (the batch's units read as rows) into the slot's staging at `cbase`, packed
    /// (after the coalesced reads; their `dst`, staging offsets, become addresses), ordered before
    /// the copy stream's later work like the other reads. Per row read, whether its value exists.
    fn read_rows(rows: &mut [DeviceRowsRequest], job: &Job<'_>, cbase: u64) -> Result<Vec<bool>, GpuError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        for r in rows.iter_mut() {
            r.dst += cbase;
        }
        // SAFETY: each row read lands at its packed offset in the slot's staging, below
        // stored_total (which the staging holds), after the coalesced reads and disjoint from
        // them and from each other; the slot's previous batch has finished (its event).
        let found = unsafe { job.source.rows_to_device(job.context.reader(), rows, Some(job.copy_stream)) }?;
        Ok(found)
    }

    /// The units nvCOMP decodes.
    pub(super) fn on_device(&self) -> Vec<&Item> {
        self.items.iter().filter(|it| it.route == Route::Device).collect()
    }
}

/// A batch's reads: the requests (the first `staged` land in the slot's staging at their `at`,
/// the rest straight into the output at theirs), per stored unit in batch order its request and
/// staging offset, the staged bytes, the batch's items and its decoded bytes.
struct Reads {
    requests: Vec<HostReadRequest>,
    staged: usize,
    at: Vec<(ReadOf, u64)>,
    /// The rows of units read as rows, packed in the staging after the coalesced reads (`dst`:
    /// the staging offset).
    rows: Vec<DeviceRowsRequest>,
    stored_total: u64,
    items: Vec<Item>,
    decoded_total: u64,
}

/// Plan a batch's reads from its units' stored spans: ranges of one value close together are
/// coalesced into one staged read; a unit read straight into the output has a read of its own.
fn plan_reads(units: &[Unit], batch: &[usize], spans: &[Option<(u64, u64)>]) -> Reads {
    let staged_spans: Vec<(&StoreKey, u64, u64)> = batch
        .iter()
        .zip(spans)
        .filter(|(&u, _)| units[u].direct.is_none() && units[u].rows.is_none())
        .filter_map(|(&u, s)| s.map(|(offset, len)| (&units[u].placement.key, offset, len)))
        .collect();
    let (mut requests, staged_at, mut stored_total) = coalesce(&staged_spans, COALESCE_GAP);
    let staged = requests.len();
    let mut rows = Vec::new();
    let mut next_staged = staged_at.into_iter();
    let mut at = Vec::with_capacity(batch.len());
    let mut items = Vec::with_capacity(batch.len());
    let mut decoded_at = 0u64;
    for (&u, span) in batch.iter().zip(spans) {
        let unit = &units[u];
        let (route, stored_len, host_offset) = match (span, unit.direct) {
            (None, _) => (Route::Missing, 0, 0),
            (Some((offset, len)), Some(out)) => {
                let key = unit.placement.key.clone();
                let (offset, len) = (*offset, *len as usize);
                let (value_len, version) = (unit.value_len, unit.version.clone());
                requests.push(HostReadRequest { key, offset, len, at: out as usize, value_len, version });
                at.push((ReadOf::Request(requests.len() - 1), 0));
                (Route::Device, len as u64, 0)
            }
            (Some((offset, _)), None) if unit.rows.is_some() => {
                let start = stored_total.next_multiple_of(STORED_ALIGN);
                let first = rows.len();
                let packed = plan_rows(unit, *offset, start, &mut rows);
                stored_total = start + packed;
                at.push((ReadOf::Rows(first..rows.len()), start));
                (Route::Device, packed, start)
            }
            (Some((_, len)), None) => {
                let (request, offset) = next_staged.next().expect("one per staged span");
                // A value whose size the chain fixes is read alone (one span per key).
                if unit.value_len.is_some() {
                    requests[request].value_len = unit.value_len;
                }
                // The units of one value in a read share their shard's version (`units_of`).
                if unit.version.is_some() {
                    requests[request].version.clone_from(&unit.version);
                }
                at.push((ReadOf::Request(request), offset));
                (Route::Device, *len, offset)
            }
        };
        items.push(Item {
            unit: u,
            stored_len,
            data_len: stored_len,
            host_offset,
            decoded_offset: decoded_at,
            route,
            crc: None,
            digest: None,
        });
        // Saturating: sizes past 2^64 are refused by the planner before any allocation.
        decoded_at =
            decoded_at.saturating_add(unit.decoded_len().checked_next_multiple_of(DECODED_ALIGN).unwrap_or(u64::MAX));
    }
    Reads { requests, staged, at, rows, stored_total, items, decoded_total: decoded_at }
}

/// Which read brings a stored unit's bytes: a request, or the rows of a unit read as rows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ReadOf {
    Request(usize),
    Rows(std::ops::Range<usize>),
}

/// The row reads of `unit` (read as rows, its bytes from `offset` of its value), packed from
/// staging offset `start`: one per slice of each of its copies, appended to `rows`. Returns the
/// packed bytes.
fn plan_rows(unit: &Unit, offset: u64, start: u64, rows: &mut Vec<DeviceRowsRequest>) -> u64 {
    let mut at = start;
    // Offsets within the chunk's bytes, checked by `plan_chunks`, and so within its value.
    for c in unit.rows.as_deref().unwrap_or_default() {
        for z in 0..c.depth {
            rows.push(DeviceRowsRequest {
                key: unit.placement.key.clone(),
                offset: offset + c.src_offset + z * c.src_height * c.src_pitch,
                rows: c.height,
                width: c.width,
                pitch: c.src_pitch,
                dst: at,
                value_len: unit.value_len,
                version: unit.version.clone(),
            });
            at += c.width * c.height;
        }
    }
    at - start
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plan::plan_chunks;
    use zarrs::array::ArraySubset;

    #[test]
    fn reads_of_a_batch_coalesce_ranges_and_skip_missing_units() {
        let key = StoreKey::new("s/c/0").unwrap();
        let other = StoreKey::new("z/c/1").unwrap();
        let unit = |key: &StoreKey, source: Source| {
            let chunk = ArraySubset::new_with_start_shape(vec![0], vec![100]).unwrap();
            let placement = plan_chunks(4, &chunk, [(vec![0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            Unit { source, ..Unit::whole(placement) }
        };
        let units = vec![
            unit(&key, Source::Range { offset: 40, len: 30 }),
            unit(&key, Source::Missing),
            unit(&key, Source::Range { offset: 10, len: 30 }),
            unit(&other, Source::Whole),
        ];
        // The sizes as the pipeline learns them: ranges as they are, the whole value asked.
        let spans = [Some((40, 30)), None, Some((10, 30)), Some((0, 55))];
        let Reads { requests, staged, at, stored_total: stored, items, decoded_total: decoded, .. } =
            plan_reads(&units, &[0, 1, 2, 3], &spans);
        assert_eq!(staged, requests.len());
        let got: Vec<(&str, u64, usize, u64)> =
            requests.iter().map(|r| (r.key.as_str(), r.offset, r.len, r.at as u64)).collect();
        // The two ranges of s/c/0 touch: one read of 60 bytes; the whole value apart.
        assert_eq!(got, vec![("s/c/0", 10, 60, 0), ("z/c/1", 0, 55, 256)]);
        assert_eq!(at, vec![(ReadOf::Request(0), 30), (ReadOf::Request(0), 0), (ReadOf::Request(1), 256)]);
        assert_eq!(stored, 311);
        let routes: Vec<Route> = items.iter().map(|it| it.route).collect();
        assert_eq!(routes, vec![Route::Device, Route::Missing, Route::Device, Route::Device]);
        let host: Vec<u64> = items.iter().map(|it| it.host_offset).collect();
        assert_eq!(host, vec![30, 0, 0, 256]);
        // 400 decoded bytes each, aligned: every unit has its place, missing ones too.
        let offsets: Vec<u64> = items.iter().map(|it| it.decoded_offset).collect();
        assert_eq!(offsets, vec![0, 4096, 8192, 12288]);
        assert_eq!(decoded, 16384);
    }

    /// Every read of a unit planned from a shard's index carries that index's version: coalesced
    /// staged reads, reads straight into the output and row reads alike (the store refuses
    /// another version's bytes).
    #[test]
    fn reads_carry_the_version_their_units_were_planned_from() {
        let version = zarrs_gds_store::ValueVersion::ETag("\"v1\"".into());
        let key = StoreKey::new("s/c/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![16, 512]).unwrap();
        let plan = |ranges: [std::ops::Range<u64>; 2]| {
            plan_chunks(4, &ArraySubset::new_with_ranges(&ranges), [(vec![0, 0], key.clone(), chunk.clone())])
                .unwrap()
                .pop()
                .unwrap()
        };
        let staged = Unit {
            source: Source::Range { offset: 40, len: 30 },
            version: Some(version.clone()),
            ..Unit::whole(plan([0..16, 0..512]))
        };
        let direct = Unit { version: Some(version.clone()), ..Unit::raw(plan([1..3, 0..512])) };
        let mut rows = Unit { version: Some(version.clone()), ..Unit::raw(plan([2..9, 100..200])) };
        rows.read_as_rows();
        assert!(direct.direct.is_some(), "read straight into the output");
        assert!(rows.rows.is_some(), "read as rows");
        let spans = [Some((40, 30)), Some((4096, 4096)), Some((4096, 28672))];
        let Reads { requests, rows, .. } = plan_reads(&[staged, direct, rows], &[0, 1, 2], &spans);
        assert_eq!(requests.len(), 2);
        assert!(requests.iter().all(|r| r.version.as_ref() == Some(&version)));
        assert!(!rows.is_empty() && rows.iter().all(|r| r.version.as_ref() == Some(&version)));
    }

    #[test]
    fn uncompressed_chunks_whose_bytes_are_one_run_of_the_output_are_read_straight_into_it() {
        // Rows 1..3 of a 4 x 8 chunk, all columns: one run of the output; columns 2..6: not.
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![4, 8]).unwrap();
        let key = StoreKey::new("c/0/0").unwrap();
        let plan = |subset: ArraySubset| plan_chunks(4, &subset, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap();
        let rows = Unit::raw(plan(ArraySubset::new_with_ranges(&[1..3, 0..8])).pop().unwrap());
        let cols = Unit::raw(plan(ArraySubset::new_with_ranges(&[1..3, 2..6])).pop().unwrap());
        assert_eq!((rows.direct, rows.source.clone()), (Some(0), Source::Range { offset: 32, len: 64 }));
        assert_eq!(cols.direct, None);
        let units = vec![cols, rows];
        let spans = [Some((40, 48)), Some((32, 64))];
        let Reads { requests, staged, at, stored_total, items, .. } = plan_reads(&units, &[0, 1], &spans);
        assert_eq!(staged, 1, "one staged read, then the direct one");
        let got: Vec<(u64, usize, u64, Option<u64>)> =
            requests.iter().map(|r| (r.offset, r.len, r.at as u64, r.value_len)).collect();
        // Both check the value's size (the chunk's 128 bytes); the direct one lands at output 0.
        assert_eq!(got, vec![(40, 48, 0, Some(128)), (32, 64, 0, Some(128))]);
        assert_eq!(at, vec![(ReadOf::Request(0), 0), (ReadOf::Request(1), 0)]);
        assert_eq!(stored_total, 48, "nothing staged for the direct read");
        assert!(items.iter().all(|it| it.route == Route::Device));
    }

    #[test]
    fn tiles_of_uncompressed_chunks_read_only_their_rows_and_place_the_same_bytes() {
        // (chunk shape, subset) in u32: rows of 384 bytes 1 KiB apart over two slices; whole rows
        // of a few rows per slice; a subset meeting the chunk's corner, of shape 3 x 5 x 70.
        let cases: [(Vec<u64>, Vec<std::ops::Range<u64>>); 3] = [
            (vec![4, 8, 256], vec![1..3, 2..6, 32..128]),
            (vec![8, 16, 64], vec![2..6, 3..7, 0..64]),
            (vec![6, 9, 100], vec![3..9, 4..9, 30..100]),
        ];
        for (shape, ranges) in cases {
            let chunk = ArraySubset::new_with_start_shape(vec![0; 3], shape.clone()).unwrap();
            let key = StoreKey::new("c/0/0/0").unwrap();
            let subset = ArraySubset::new_with_ranges(&ranges);
            let placement = plan_chunks(4, &subset, [(vec![0; 3], key, chunk)]).unwrap().pop().unwrap();
            let data: Vec<u8> = (0..placement.chunk_bytes as u32).map(|i| (i * 31 + i / 257) as u8).collect();
            let plain = Unit::raw(placement);
            let mut unit = plain.clone();
            unit.read_as_rows();
            assert!(unit.rows.is_some(), "{shape:?} {ranges:?}");
            let out_len = subset.num_elements_usize() * 4;
            // As before: the narrowed range, its copies.
            let Source::Range { offset, len } = plain.source else { panic!("a range") };
            let mut expected = vec![0u8; out_len];
            for c in &plain.placement.copies {
                c.apply_host(&data[offset as usize..][..len as usize], &mut expected);
            }
            // Read as rows: after 100 coalesced bytes, each row read lands packed in the staging,
            // and the rewritten copies place the same bytes.
            let mut units = vec![
                Unit { source: Source::Range { offset: 0, len: 100 }, ..Unit::whole(plain.placement.clone()) },
                unit,
            ];
            units[0].placement.key = StoreKey::new("c/9").unwrap();
            let Reads { requests, rows, at, stored_total, items, .. } =
                plan_reads(&units, &[0, 1], &[Some((0, 100)), Some((offset, len))]);
            assert_eq!(requests.len(), 1, "only the other unit is coalesced");
            assert_eq!(at[1], (ReadOf::Rows(0..rows.len()), 256), "rows packed from the next aligned offset");
            let packed: u64 = rows.iter().map(DeviceRowsRequest::packed_len).sum();
            assert!(2 * packed <= len && stored_total == 256 + packed, "{packed} of {len}");
            let mut staging = vec![0xEEu8; stored_total as usize];
            for r in &rows {
                assert_eq!(r.value_len, Some(data.len() as u64));
                for k in 0..r.rows {
                    let from = (r.offset + k * r.pitch) as usize;
                    let to = (r.dst + k * r.width) as usize;
                    staging[to..to + r.width as usize].copy_from_slice(&data[from..from + r.width as usize]);
                }
            }
            assert_eq!((items[1].host_offset, items[1].stored_len), (256, packed));
            assert_eq!(units[1].raw_len(), packed, "what the host check expects of it");
            let mut got = vec![0u8; out_len];
            for c in &units[1].placement.copies {
                c.apply_host(&staging[items[1].host_offset as usize..], &mut got);
            }
            assert_eq!(got, expected, "{shape:?} {ranges:?}");
        }
        // Left as they are: rows narrower than MIN_ROW, a range mostly needed, a direct read.
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![16, 512]).unwrap();
        let key = StoreKey::new("c/0/0").unwrap();
        for ranges in [[2..9, 0..60], [2..9, 0..400], [2..9, 0..512]] {
            let subset = ArraySubset::new_with_ranges(&ranges);
            let placement = plan_chunks(4, &subset, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            let mut unit = Unit::raw(placement);
            unit.read_as_rows();
            assert!(unit.rows.is_none(), "{ranges:?}");
        }
    }

    #[test]
    fn whole_values_far_longer_than_any_encoding_are_refused_when_sized() {
        // A 1 MiB chunk whose file is a sparse 64 GiB.
        let chunk = ArraySubset::new_with_shape(vec![256, 1024]);
        let key = StoreKey::new("a/c/0/1").unwrap();
        let placement = plan_chunks(4, &chunk, [(vec![0, 1], key, chunk.clone())]).unwrap().pop().unwrap();
        let unit = Unit::whole(placement);
        assert_eq!(whole_span(&unit, 900 << 10).unwrap(), (0, 900 << 10));
        let err = whole_span(&unit, 64 << 30).unwrap_err().to_string();
        assert!(err.contains("a/c/0/1") && err.contains("68719476736 stored bytes for 1048576 decoded"), "{err}");
    }
}

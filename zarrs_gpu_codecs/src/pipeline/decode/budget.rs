//! How a read's units fit the device: batches sized to the free memory beside the output,
//! before anything is allocated, and the room each batch's metadata takes.

use crate::config::GpuConfig;
use crate::error::GpuError;
use crate::pipeline::batch::{batch_budget, batches_by_size, DECODED_ALIGN};
use crate::pipeline::layout::MetaLayout;
use crate::pipeline::place;
use crate::pipeline::route::DeviceChain;
use crate::pipeline::unit::Unit;

/// Device memory a batch's metadata takes: its [`MetaLayout`] with every unit checked, decoded
/// and digested, the most any routing of the batch takes.
pub(super) fn meta_len(units: &[Unit], chain: &DeviceChain, batch: &[usize]) -> u64 {
    let (gather, copies) = table_room(units, chain, batch.iter().copied());
    MetaLayout::new(batch.len(), batch.len(), true, gather, copies).len()
}

/// Room for a batch's placement tables: a gather job per part of each unit (chains that gather;
/// a unit several subsets of a request meet has a part for each) and every unit's strided
/// copies, as table entries (rows wider than `place::MAX_ROW` take several).
pub(super) fn table_room(units: &[Unit], chain: &DeviceChain, batch: impl Iterator<Item = usize>) -> (usize, usize) {
    let pieces = |u: usize| units[u].placement.copies.iter().map(place::row_pieces).sum::<usize>();
    let (parts, copies) = batch.fold((0, 0), |(n, c), u| (n + units[u].placement.parts.len(), c + pieces(u)));
    (if chain.needs_gather() { parts } else { 0 }, copies)
}

/// The batches of `units`, after checking that the output this read allocates (`out_bytes`:
/// none for a caller's destination) and two slots of the largest batch (stored bytes at most
/// about the decoded bytes, decoded bytes, nvCOMP's temp space, metadata) fit the `free` device
/// memory, before anything is allocated. Where they do not, the batches shrink (down to the
/// largest unit alone) until they fit with [`HEADROOM`] to spare: a device filled by PyTorch or
/// CuPy still reads, in more batches, what fits beside its output. The flag: whether they shrank.
/// `remote`: the source is an object store, whose batches are at most
/// [`GpuConfig::remote_batch_bytes`].
pub(super) fn plan_batches(
    units: &[Unit],
    chain: &DeviceChain,
    config: &GpuConfig,
    (free, remote): (u64, bool),
    out_bytes: u64,
) -> Result<(Vec<Vec<usize>>, bool), GpuError> {
    let staged_len = |u: usize| staged_len(&units[u], chain);
    let largest = (0..units.len()).map(staged_len).max().unwrap_or(0);
    // Every unit is staged whole (decoded, or the bytes read of an uncompressed one): one that
    // (with the output) exceeds the free memory is refused before any batch is planned, which
    // also keeps the batch arithmetic (and nvCOMP's sizes) far from overflow.
    let refuse = |needed: u64| -> Result<(), GpuError> {
        if needed > free {
            return Err(GpuError::OutOfMemory { needed, free, device: config.device() });
        }
        Ok(())
    };
    refuse(out_bytes.saturating_add(largest))?;
    let small_free = chain.compression.as_ref().filter(|c| c.prefers_large_batches()).map(|_| free);
    let floor = largest.next_multiple_of(DECODED_ALIGN).max(DECODED_ALIGN);
    let mut budget =
        batch_budget(config.staging_bytes() as u64, config.staging_is_set(), largest, small_free, out_bytes);
    if let Some(cap) = config.remote_batch_bytes().filter(|_| remote) {
        budget = budget.min(cap.max(floor));
    }
    let mut temps = std::collections::HashMap::new();
    let room = free.saturating_sub(out_bytes).saturating_sub(HEADROOM);
    let mut shrunk = false;
    loop {
        let batches = batches_by_size((0..units.len()).map(staged_len), budget);
        let set = working_set(units, chain, config, &batches, &mut temps)?;
        if set <= room || budget <= floor {
            refuse(set.saturating_add(out_bytes))?;
            return Ok((batches, shrunk));
        }
        // The working set grows about linearly with the budget: aim at what fits, and shrink by
        // an eighth at least, so that batches whose shape does not change still end.
        let aim = (budget as f64 * room as f64 / set as f64) as u64;
        budget = aim.min(budget - budget / 8).max(floor);
        shrunk = true;
    }
}

/// Device memory a read leaves free beyond its plan: for what it does not plan (the fill block,
/// streams and events), and the driver's granularity.
const HEADROOM: u64 = 16 << 20;

/// What a unit takes in a slot's staging: its decoded bytes (and stored ones as many at most),
/// the bytes read for an uncompressed one, nothing when read straight into the output.
fn staged_len(unit: &Unit, chain: &DeviceChain) -> u64 {
    match unit {
        unit if unit.direct.is_some() => 0,
        unit if !chain.is_checked() => unit.raw_len(),
        unit => unit.decoded_len(),
    }
}

/// The device memory `batches` take beside the output: two slots of the largest batch (one when
/// there is one batch) and one decoder scratch. The codec's scratch bounds are asked once per
/// batch shape (`temps`: most batches of a read have the same).
fn working_set(
    units: &[Unit],
    chain: &DeviceChain,
    config: &GpuConfig,
    batches: &[Vec<usize>],
    temps: &mut std::collections::HashMap<(usize, u64, u64), u64>,
) -> Result<u64, GpuError> {
    let staged_len = |u: usize| staged_len(&units[u], chain);
    let slots = if batches.len() > 1 { 2 } else { 1 };
    let (mut largest_slot, mut largest_temp) = (0u64, 0u64);
    for batch in batches {
        // Saturating: a sum past 2^64 (a huge staging budget) is refused by the caller.
        let decoded = batch.iter().fold(0u64, |a, &u| a.saturating_add(staged_len(u).next_multiple_of(DECODED_ALIGN)));
        let max_chunk = batch.iter().map(|&u| units[u].decoded_len()).max().unwrap_or(0);
        let temp = match &chain.compression {
            Some(codec) if chain.device_may_decode(config.decode_trust()) => {
                let key = (batch.len(), max_chunk, decoded);
                if let Some(&temp) = temps.get(&key) {
                    temp
                } else {
                    let temp = codec.scratch_bound(batch.len(), max_chunk as usize, decoded as usize)? as u64;
                    *temps.entry(key).or_insert(temp)
                }
            }
            _ => 0,
        };
        let slot = decoded.saturating_mul(2).saturating_add(meta_len(units, chain, batch));
        largest_slot = largest_slot.max(slot);
        // One scratch serves both slots (`Buffers::scratch`).
        largest_temp = largest_temp.max(temp);
    }
    // A buffer that a later, larger batch outgrows is replaced by one a quarter larger than asked
    // (`ensure`): each may reach that.
    let grown = |bytes: u64| bytes.saturating_add(bytes / 4);
    Ok(grown(largest_slot).saturating_mul(slots).saturating_add(grown(largest_temp)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::output::Output;
    use crate::pipeline::plan::plan_chunks;
    use zarrs::array::ArraySubset;
    use zarrs_storage::StoreKey;

    #[test]
    fn placement_tables_have_room_for_every_part_of_a_chunk_several_subsets_meet() {
        // A chunk three crops meet is one unit with three parts: a gather job each (the first
        // GPU run of requests sized one per unit, and the gather table ran past its room).
        let key = StoreKey::new("c/0/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![8, 8]).unwrap();
        let crops = [[0..4, 0..4], [2..6, 3..8], [0..8, 5..6]].map(|r| ArraySubset::new_with_ranges(&r));
        let mut placements = Vec::new();
        for (i, crop) in crops.iter().enumerate() {
            let mut p = plan_chunks(2, crop, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            p.shift_output(i as u64 * 1024).unwrap();
            placements.push(p);
        }
        let merged = crate::pipeline::request::merge_placements(placements).unwrap();
        assert_eq!(merged.len(), 1);
        let units: Vec<Unit> = merged.into_iter().map(Unit::whole).collect();
        let gather = DeviceChain { swap: 2, ..DeviceChain::default() };
        let (jobs, copies) = table_room(&units, &gather, 0..1);
        assert_eq!(jobs, 3);
        assert_eq!(copies, units[0].placement.copies.len());
        let layout = MetaLayout::new(1, 1, false, jobs, copies);
        assert!(
            layout.holds_tables(3, copies) && !layout.holds_tables(4, copies) && !layout.holds_tables(3, copies + 1)
        );
        assert_eq!(table_room(&units, &DeviceChain::default(), 0..1).0, 0);
    }

    #[test]
    fn a_callers_destination_is_not_counted_against_free_memory() {
        // 16 chunks of 1 MiB (rows of 16 KiB, none one run of the output): 16 MiB of output,
        // staged one chunk a batch.
        let array = ArraySubset::new_with_shape(vec![64, 65536]);
        let chunks = (0..16u64).map(|c| {
            let subset = ArraySubset::new_with_start_shape(vec![0, c * 4096], vec![64, 4096]).unwrap();
            (vec![0, c], StoreKey::new(format!("c/0/{c}")).unwrap(), subset)
        });
        let units: Vec<Unit> = plan_chunks(4, &array, chunks).unwrap().into_iter().map(Unit::whole).collect();
        let (chain, config) = (DeviceChain::default(), GpuConfig::default().with_staging_bytes(1 << 20));
        let out_bytes = 16 << 20;
        // Less free memory than the output, room for two slots of staging (about 4 MiB).
        let free = 6 << 20;
        let new =
            plan_batches(&units, &chain, &config, (free, false), Output::New.holding(out_bytes).unwrap().allocated());
        assert!(matches!(new, Err(GpuError::OutOfMemory { .. })), "{new:?}");
        // Into a caller's destination of 16 MiB, which exists already: only staging counts.
        let into = Output::Into { ptr: 0, len: out_bytes as usize }.holding(out_bytes).unwrap().allocated();
        let (batches, _) = plan_batches(&units, &chain, &config, (free, false), into).unwrap();
        assert_eq!(batches.len(), 16);
        // Staging alone still has to fit.
        let tight = plan_batches(&units, &chain, &config, (3 << 20, false), into);
        assert!(matches!(tight, Err(GpuError::OutOfMemory { .. })), "{tight:?}");
    }

    /// With the default staging budget (1 GiB) the 64 chunks of 1 MiB are one batch, whose
    /// slot takes twice their bytes; with less free memory the batches shrink until two slots
    /// fit beside the output, rather than the read being refused; only when one chunk a batch
    /// does not fit is it refused.
    #[test]
    fn batches_shrink_to_the_free_memory_before_a_read_is_refused() {
        let array = ArraySubset::new_with_shape(vec![64, 1 << 20]);
        let chunks = (0..64u64).map(|c| {
            let subset = ArraySubset::new_with_start_shape(vec![0, c * 16384], vec![64, 16384]).unwrap();
            (vec![0, c], StoreKey::new(format!("c/0/{c}")).unwrap(), subset)
        });
        let units: Vec<Unit> = plan_chunks(1, &array, chunks).unwrap().into_iter().map(Unit::whole).collect();
        let (chain, config) = (DeviceChain::default(), GpuConfig::default());
        let out_bytes = 64 << 20;
        let (roomy, shrunk) = plan_batches(&units, &chain, &config, (1 << 30, false), out_bytes).unwrap();
        assert!(roomy.len() == 1 && !shrunk);
        // Output plus 48 MiB, less the headroom: two slots of at most 16 MiB, so batches of at
        // most 8 chunks.
        let (tight, shrunk) =
            plan_batches(&units, &chain, &config, ((64 << 20) + (48 << 20), false), out_bytes).unwrap();
        assert!(shrunk);
        assert!(
            tight.len() >= 8 && tight.iter().all(|b| b.len() <= 8),
            "{:?}",
            tight.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert_eq!(tight.concat(), (0..64).collect::<Vec<_>>(), "every unit once, in order");
        let mut temps = std::collections::HashMap::new();
        let set = working_set(&units, &chain, &config, &tight, &mut temps).unwrap();
        assert!(set <= 32 << 20, "{set}");
        // Room for the output and a chunk but not for two slots of one: refused, with the sizes.
        let none = plan_batches(&units, &chain, &config, ((64 << 20) + (3 << 20), false), out_bytes);
        assert!(matches!(none, Err(GpuError::OutOfMemory { needed, .. }) if needed > (67 << 20)), "{none:?}");
        // From an object store: batches of at most its bound (16 MiB here: 16 chunks), none with
        // a bound of 0; other stores ignore it.
        let remote = config.clone().with_remote_batch_bytes(16 << 20);
        let (cut, _) = plan_batches(&units, &chain, &remote, (1 << 30, true), out_bytes).unwrap();
        assert_eq!(cut.iter().map(Vec::len).collect::<Vec<_>>(), vec![16; 4]);
        let whole = plan_batches(&units, &chain, &remote.with_remote_batch_bytes(0), (1 << 30, true), out_bytes);
        assert_eq!(whole.unwrap().0.len(), 1);
        let local =
            plan_batches(&units, &chain, &config.with_remote_batch_bytes(16 << 20), (1 << 30, false), out_bytes);
        assert_eq!(local.unwrap().0.len(), 1);
    }
}

//! Our device LZ4 kernel's code, run on the CPU (both ways of running a thread block), never reads or
//! writes outside its buffers and agrees with lz4_flex and the host walk: a block it decodes,
//! lz4_flex decodes to the same bytes and the walk accepts; one lz4_flex rejects, it rejects;
//! one only it rejects breaks LZ4's end-of-block rules.
//!
//! Input: the expected length (u16 little endian), then the block.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::lz4_block::check_block;
use zarrs_gpu_codecs::lz4_decode::{decode_on_host, HostThreads, END_RULES, OK};

fuzz_target!(|data: &[u8]| {
    let Some((n, block)) = data.split_first_chunk::<2>() else { return };
    let n = usize::from(u16::from_le_bytes(*n));
    let mut flexed = vec![0u8; n];
    let flex = lz4_flex::block::decompress_into(block, &mut flexed).ok() == Some(n);
    let mut outs = Vec::new();
    for threads in HostThreads::ALL {
        // Guard bytes after the output the kernel is given.
        let mut out = vec![0xA5u8; n + 32];
        let [(status, decoded)] = decode_on_host(&mut [(block, &mut out[..n])], threads)[..] else { unreachable!() };
        assert!(out[n..].iter().all(|&b| b == 0xA5), "{threads:?} wrote past the output");
        assert!(decoded <= n as u64);
        out.truncate(n);
        outs.push((status, out));
    }
    let (status, out) = &outs[0];
    assert_eq!(*status, outs[1].0, "the two ways of running a thread block disagree");
    if *status == OK {
        assert!(flex && *out == flexed && outs[1].1 == flexed, "ours and lz4_flex decode different bytes");
        assert_eq!(check_block(block, n), Ok(n));
    } else {
        assert!(check_block(block, n).is_err());
        if flex {
            assert_eq!(*status, END_RULES, "lz4_flex decodes what ours rejects");
        }
    }
});

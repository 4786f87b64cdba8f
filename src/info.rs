//! `zarrs-gpu info`: an array's metadata and its decode plan (where each codec runs and how, as
//! the device codec families describe themselves), or a group's arrays and multiscale levels.

use std::path::Path;
use std::sync::Arc;

use zarrs::array::codec::{CodecChain, ShardingCodecConfiguration};
use zarrs::array::{Array, CodecMetadataOptions};
use zarrs::group::Group;
use zarrs::metadata::NodeMetadata;
use zarrs::node::NodePath;
use zarrs_gpu::zarrs_gpu_codecs::{host_decode_reason, DeviceCodecPlugin};
use zarrs_gpu::AnyStore;

use super::Error;

pub(crate) fn info(path: &Path, node: &str) -> Result<(), Error> {
    let store = zarrs_gpu::store_at(path)?;
    let node = zarrs_gpu::open::node_path(node);
    if Array::open(store.clone(), &node).is_err() {
        if let Ok(group) = Group::open(store.clone(), &node) {
            return group_info(&store, &group, &node);
        }
    }
    let array = super::open(path, &node)?;
    println!("{}", array.metadata().to_string_pretty());
    println!("data type: {}; shape {:?}; chunk grid {:?}", array.data_type(), array.shape(), array.chunk_grid_shape());
    let codecs = array.codecs();
    // The route a read takes (nvCOMP's absence included), as for each array of a group.
    let reason = host_decode_reason(&array);
    println!("decode plan:");
    print_plan(&codecs, reason.is_none(), 1);
    let sharded = inner_codecs(&codecs).is_some();
    match reason {
        None if !sharded && codecs.bytes_to_bytes_codecs().is_empty() => {
            println!("chunks are read straight to the device");
        }
        None => println!("stored chunks are read to host memory, checked there, then decoded and placed on the device"),
        Some(reason) => println!("chunks are decoded by zarrs on the host, then copied once: {reason}"),
    }
    Ok(())
}

/// A group: its OME-Zarr multiscale levels (if its attributes describe them), then every array
/// under it, one line each: shape, data type, chunk grid, and whether the device decodes it.
fn group_info(store: &Arc<AnyStore>, group: &Group<AnyStore>, node: &str) -> Result<(), Error> {
    println!("group {node}");
    for (m, multiscale) in zarrs_gpu::multiscale_levels(group).iter().enumerate() {
        let name = if multiscale.name.is_empty() { String::new() } else { format!(" {}", multiscale.name) };
        println!("OME-Zarr multiscale {m}{name}");
        for (level, full) in multiscale.levels.iter().enumerate() {
            match Array::open(store.clone(), full) {
                Ok(array) => println!("  level {level}: {full} shape {:?}", array.shape()),
                Err(err) => println!("  level {level}: {full} cannot be opened: {err}"),
            }
        }
    }
    let nodes = group.traverse()?;
    let arrays: Vec<&NodePath> =
        nodes.iter().filter(|(_, m)| matches!(m, NodeMetadata::Array(_))).map(|(p, _)| p).collect();
    // nvCOMP's load error lists every place it looked (hundreds of characters): said once, below.
    let nvcomp = zarrs_gpu::nvcomp_sys::NvcompLibrary::get().err().map(|e| e.to_string());
    let mut nvcomp_needed = false;
    println!("{} {}:", arrays.len(), if arrays.len() == 1 { "array" } else { "arrays" });
    for path in arrays {
        match Array::open(store.clone(), path.as_str()) {
            Ok(array) => {
                let chunks = array
                    .chunk_shape(&vec![0; array.dimensionality()])
                    .map(|c| c.iter().map(|n| n.get()).collect::<Vec<_>>());
                let route = match host_decode_reason(&array) {
                    None => "decoded on the device".to_string(),
                    Some(reason) if Some(&reason) == nvcomp.as_ref() => {
                        nvcomp_needed = true;
                        "host route: nvCOMP could not be loaded (below)".to_string()
                    }
                    Some(reason) => format!("host route: {reason}"),
                };
                println!(
                    "  {} shape {:?} {} chunks {:?}: {route}",
                    path.as_str(),
                    array.shape(),
                    array.data_type(),
                    chunks.unwrap_or_default()
                );
            }
            Err(err) => println!("  {} cannot be opened: {err}", path.as_str()),
        }
    }
    if let (true, Some(nvcomp)) = (nvcomp_needed, nvcomp) {
        println!("{nvcomp}");
    }
    Ok(())
}

/// The inner and index codec chains of a `sharding_indexed` array-to-bytes codec.
fn inner_codecs(codecs: &CodecChain) -> Option<(CodecChain, CodecChain)> {
    let a2b = codecs.array_to_bytes_codec();
    if name(a2b.as_ref()) != "sharding_indexed" {
        return None;
    }
    let configuration: ShardingCodecConfiguration =
        a2b.configuration_v3(&CodecMetadataOptions::default())?.to_typed().ok()?;
    let ShardingCodecConfiguration::V1(c) = configuration else { return None };
    Some((CodecChain::from_metadata(&c.codecs).ok()?, CodecChain::from_metadata(&c.index_codecs).ok()?))
}

/// One line per codec, inner chains of shards indented: where it runs and how.
fn print_plan(codecs: &CodecChain, device: bool, depth: usize) {
    for line in plan_lines(codecs, device, depth) {
        println!("{line}");
    }
}

/// How the device decodes a bytes-to-bytes codec, for its plan line: its plugin's description,
/// or the pipeline's own check (crc32c).
fn device_codec_text(name: &str) -> &'static str {
    if let Some(description) = DeviceCodecPlugin::describe(name) {
        return description;
    }
    if name == "crc32c" {
        "verified with nvCOMP CRC32C before anything is decoded"
    } else {
        ""
    }
}

/// [`print_plan`]'s lines.
fn plan_lines(codecs: &CodecChain, device: bool, depth: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let indent = "  ".repeat(depth);
    let route = |on_device: &str| match (device, on_device) {
        (false, _) => "host".to_string(),
        (true, "") => "device".to_string(),
        (true, how) => format!("device ({how})"),
    };
    for codec in codecs.array_to_array_codecs() {
        let name = name(codec.as_ref());
        let how = if name == "transpose" { "elements gathered into C order by the placement kernel" } else { "" };
        let how = zarrs_gpu::zarrs_gpu_codecs::delta_device_text(codec.as_ref()).unwrap_or(how);
        lines.push(format!("{indent}{name:<18} {}", route(how)));
    }
    let a2b = codecs.array_to_bytes_codec();
    if let Some((inner, index)) = inner_codecs(codecs) {
        let index_names: Vec<String> =
            index.create_metadatas(&CodecMetadataOptions::default()).iter().map(|m| m.name().to_string()).collect();
        let index = format!("index [{}]", index_names.join(", "));
        let what = if device {
            format!("device ({index} read with partial reads and decoded on the host; the inner chunks a read needs are fetched in coalesced reads and decoded in batches)")
        } else {
            format!("host ({index})")
        };
        lines.push(format!("{indent}{:<18} {what}", "sharding_indexed"));
        lines.extend(plan_lines(&inner, device, depth + 1));
        return lines;
    }
    lines.push(format!("{indent}{:<18} {}", name(a2b.as_ref()), route("placed by one kernel per batch")));
    for codec in codecs.bytes_to_bytes_codecs() {
        let name = name(codec.as_ref());
        lines.push(format!("{indent}{name:<18} {}", route(device_codec_text(&name))));
    }
    lines
}

fn name(codec: &dyn zarrs::plugin::ExtensionName) -> String {
    codec.name_v3().map_or_else(|| "(unnamed)".into(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zarrs::array::codec::{
        BloscCodec, BloscCompressor, BloscShuffleMode, BytesCodec, TransposeCodec, TransposeOrder,
    };

    use super::*;

    /// A Blosc line read `blosc device ()` and a transpose `transpose host` on the device route.
    #[test]
    fn plan_lines_say_how_the_device_decodes_each_codec() {
        let level = 5u8.try_into().expect("a blosc level");
        let blosc = BloscCodec::new(BloscCompressor::LZ4, level, None, BloscShuffleMode::Shuffle, Some(4)).unwrap();
        let transpose = TransposeCodec::new(TransposeOrder::new(&[1, 0]).unwrap());
        let chain = CodecChain::new(vec![Arc::new(transpose)], Arc::new(BytesCodec::little()), vec![Arc::new(blosc)]);
        let lines = plan_lines(&chain, true, 1);
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(
            lines[0].trim_start().starts_with("transpose") && lines[0].contains("device (elements gathered"),
            "{lines:#?}"
        );
        assert!(
            lines[2].trim_start().starts_with("blosc") && lines[2].contains("device (our LZ4 decoder"),
            "{lines:#?}"
        );
        assert!(lines.iter().all(|l| !l.contains("()")), "{lines:#?}");
        // A plugin's codec without a text: the route alone, no empty brackets.
        assert_eq!(format!("{:?}", device_codec_text("a.plugin")), "\"\"");
        // The host route says host for each.
        assert!(plan_lines(&chain, false, 0).iter().all(|l| l.ends_with(" host")));
    }
}

//! GPU mode's codec registration: zarrs' "zstd" is a `GpuModeCodec` carrying the device zstd codec inside
//! `with_gpu_config` and only there. One test, so no other test's scope interferes (the
//! registration is process-wide, like zarrs' codec registry).

use std::error::Error;
use std::sync::Arc;

use zarrs::array::codec::ZstdCodec;
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes};
use zarrs_gpu::zarrs_gpu_codecs::GpuModeCodec;
use zarrs_gpu::{with_gpu_config, GdsStore, GpuConfig};

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

fn is_device_zstd(array: &Array<GdsStore>) -> bool {
    let codecs = array.codecs();
    let b2b = codecs.bytes_to_bytes_codecs();
    b2b.len() == 1 && b2b[0].as_any().downcast_ref::<GpuModeCodec>().is_some_and(|c| c.device().name() == "zstd")
}

#[test]
fn device_zstd_codec_is_registered_in_scope_only() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let written = ArrayBuilder::new(vec![30, 20], vec![8, 8], data_type::int32(), -1i32)
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(5, true))])
        .build(store.clone(), "/v3")?;
    written.store_metadata()?;
    let values: Vec<i32> = (0..600).map(|i| i * 7 - 300).collect();
    written.store_array_subset(&written.subset_all(), values.clone())?;
    std::fs::create_dir_all(dir.path().join("v2"))?;
    std::fs::write(
        dir.path().join("v2/.zarray"),
        r#"{"zarr_format": 2, "shape": [10], "chunks": [4], "dtype": "<u2", "compressor": {"id": "zstd", "level": 1},
            "fill_value": 0, "order": "C", "filters": null}"#,
    )?;

    let outside = Array::open(store.clone(), "/v3")?;
    assert!(!is_device_zstd(&outside));
    let metadata_outside = outside.metadata().to_string_pretty();
    let open_both = || -> Result<(Array<GdsStore>, Array<GdsStore>)> {
        Ok((Array::open(store.clone(), "/v3")?, Array::open(store.clone(), "/v2")?))
    };
    with_gpu_config(GpuConfig::default(), || -> Result {
        let (inside, v2) = open_both()?;
        assert!(is_device_zstd(&inside) && is_device_zstd(&v2));
        // Identical metadata, identical host decoding through the ordinary zarrs API.
        assert_eq!(inside.metadata().to_string_pretty(), metadata_outside);
        assert_eq!(inside.retrieve_array_subset::<Vec<i32>>(&inside.subset_all())?, values);
        let encoded = inside.retrieve_encoded_chunk(&[1, 1])?.unwrap();
        let plain = outside.retrieve_encoded_chunk(&[1, 1])?.unwrap();
        assert_eq!(encoded, plain);
        let chunk: ArrayBytes<'static> = inside.retrieve_chunk(&[1, 1])?;
        assert_eq!(chunk, outside.retrieve_chunk::<ArrayBytes<'static>>(&[1, 1])?);
        // Nested: still registered after the inner scope ends.
        with_gpu_config(GpuConfig::default().with_device(0), || {
            assert!(is_device_zstd(&Array::open(store.clone(), "/v3").unwrap()));
        });
        assert!(is_device_zstd(&Array::open(store.clone(), "/v3")?));
        Ok(())
    })?;
    assert!(!is_device_zstd(&Array::open(store.clone(), "/v3")?), "unregistered when the scope ends");
    // A panic inside the scope unregisters too.
    let caught = std::panic::catch_unwind(|| with_gpu_config(GpuConfig::default(), || panic!("inside")));
    assert!(caught.is_err());
    let (after, v2) = open_both()?;
    assert!(!is_device_zstd(&after) && !is_device_zstd(&v2));
    Ok(())
}

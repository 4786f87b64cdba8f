//! GPU mode's codec registration: zarrs' "zstd" is a `GpuModeCodec` carrying the device zstd codec inside
//! `with_gpu_config` and only there: not after the scope ends, and not on another thread while it
//! is open (the registration is process-wide, like zarrs' codec registry; the codec it builds
//! follows the opening thread's scope).

use std::error::Error;
use std::sync::{Arc, Barrier};

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

#[test]
fn a_thread_outside_any_scope_gets_zarrs_codecs_while_another_thread_is_inside_one() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let written = ArrayBuilder::new(vec![40, 24], vec![16, 8], data_type::float32(), 0.5f32)
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, true))])
        .build(store.clone(), "/z")?;
    written.store_metadata()?;
    let values: Vec<f32> = (0..960).map(|i| (i as f32 * 0.37).sin() * 40.0 - 3.0).collect();
    written.store_array_subset(&written.subset_all(), values.clone())?;
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| -> Result {
        let inside = scope.spawn(|| {
            with_gpu_config(GpuConfig::default(), || {
                let seen = Array::open(store.clone(), "/z").map(|a| is_device_zstd(&a));
                // The scope is open while the other thread opens the array, until it is done.
                barrier.wait();
                barrier.wait();
                seen
            })
        });
        barrier.wait();
        let outside = Array::open(store.clone(), "/z");
        barrier.wait();
        let outside = outside?;
        let b2b = outside.codecs().bytes_to_bytes_codecs().to_vec();
        assert!(
            b2b.len() == 1 && b2b[0].as_any().downcast_ref::<ZstdCodec>().is_some(),
            "a thread outside any scope got {b2b:?}, not zarrs' zstd codec"
        );
        assert_eq!(outside.retrieve_array_subset::<Vec<f32>>(&outside.subset_all())?, values);
        assert!(inside.join().map_err(|_| "the thread inside the scope panicked")??, "inside: not the device codec");
        Ok(())
    })
}

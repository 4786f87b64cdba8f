//! Hand a device array to another library through DLPack, without a copy: the consumer's stream
//! waits on the read (no host wait), the tensor owns the memory, and the consumer's deleter frees
//! it. Here the "other library" is this crate again, wrapping the tensor back.
//!
//! ```text
//! cargo run --release --example dlpack -- [PATH [NODE]]
//! ```
//! Without PATH a float32 sample array is written to a temporary directory first. Needs an NVIDIA
//! GPU and its driver (and nvCOMP for compressed arrays). From Python, `torch.from_dlpack` and
//! `cupy.from_dlpack` take such a tensor the same way.

use std::error::Error;

use zarrs::array::ArrayBytes;
use zarrs_gpu::zarrs_gpu_codecs::dlpark::traits::TensorView;
use zarrs_gpu::zarrs_gpu_codecs::DlpackStream;
use zarrs_gpu::{sample, ArrayDeviceExt, DeviceArray};

fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, _sample) = sample::given_or_sample(args.first().map(std::path::Path::new), "sample.zarr", |p| {
        sample::create_sample_array(p, &[64, 256, 256], &[32, 64, 64])?;
        Ok(())
    })?;
    // Errors name the store's path and the node (zarrs' own say only what is missing).
    let array = zarrs_gpu::open_array(&path, args.get(1).map_or("/", String::as_str), "the NODE argument")?;
    let data: DeviceArray<f32> = array.retrieve_array_subset_device(&array.subset_all())?;

    // The consumer's stream (in Python: the `stream` argument of `__dlpack__`).
    let consumer = data.stream().context().new_stream()?;
    let tensor = data.into_dlpack(DlpackStream::Stream(consumer.cu_stream()))?;
    println!(
        "DLPack tensor: shape {:?}, {:?}, device {:?}, at {:p}",
        tensor.shape(),
        tensor.data_type(),
        tensor.dl_tensor().device,
        tensor.data_ptr()
    );

    // The consumer's side: wrap the tensor (it is released when the array drops).
    consumer.synchronize()?;
    let wrapped = DeviceArray::<f32>::from_dlpack(tensor, array.data_type().clone())?;
    let host = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?;
    assert!(wrapped.to_host_bytes()? == host.as_ref(), "the wrapped tensor holds zarrs' elements");
    println!("wrapped back without a copy: {:?}, the same elements as zarrs' host read", wrapped.shape());
    Ok(())
}

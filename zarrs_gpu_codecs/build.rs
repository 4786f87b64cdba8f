//! With the `cpu-kernels` feature (on in this crate's own tests, through its dev-dependency on
//! itself): the device LZ4 and zstd decoders' CUDA sources compiled for the CPU behind a thin shim, so that
//! tests run the kernel's very code. Without a C++ compiler the build fails: those tests never
//! skip.

fn main() {
    println!("cargo:rerun-if-changed=src/codecs/host_shim.h");
    println!("cargo:rerun-if-changed=src/codecs/lz4/decode.cu");
    println!("cargo:rerun-if-changed=src/codecs/lz4/host_shim.cpp");
    println!("cargo:rerun-if-changed=src/codecs/lz4/host_shim_threads.cpp");
    println!("cargo:rerun-if-changed=src/codecs/lz4/host_shim_lanes.cpp");
    println!("cargo:rerun-if-changed=src/codecs/zstd/decode.cu");
    println!("cargo:rerun-if-changed=src/codecs/zstd/host_shim.cpp");
    println!("cargo:rerun-if-changed=src/codecs/zstd/blocks.cu");
    println!("cargo:rerun-if-changed=src/codecs/zstd/entropy.cu");
    println!("cargo:rerun-if-changed=src/codecs/zstd/bytes.cu");
    if std::env::var_os("CARGO_FEATURE_CPU_KERNELS").is_some() {
        cc::Build::new()
            .cpp(true)
            .std("c++11")
            .file("src/codecs/lz4/host_shim.cpp")
            .file("src/codecs/lz4/host_shim_threads.cpp")
            .file("src/codecs/lz4/host_shim_lanes.cpp")
            .file("src/codecs/zstd/host_shim.cpp")
            // The kernels read shared memory through more than one type (as CUDA allows).
            .flag_if_supported("-fno-strict-aliasing")
            .warnings(true)
            .extra_warnings(true)
            .warnings_into_errors(true)
            .compile("zarrs_gpu_cpu_kernels");
    }
}

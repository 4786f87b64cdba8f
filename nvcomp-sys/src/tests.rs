use super::*;

#[test]
fn package_directories_of_a_prefix_are_found() {
    let prefix = tempfile::tempdir().unwrap();
    for d in ["lib/python3.12/site-packages", "lib/python3/dist-packages", "lib/perl5/site-packages"] {
        std::fs::create_dir_all(prefix.path().join(d)).unwrap();
    }
    let found = package_dirs(prefix.path());
    let want = ["lib/python3.12/site-packages", "lib/python3/dist-packages"].map(|d| prefix.path().join(d));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(want.iter().all(|w| found.contains(w)), "{found:?}");
}

#[test]
fn missing_library_is_a_clear_error() {
    let err = NvcompLibrary::load_first(&["/nonexistent/libnvcomp.so.6".into()]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("/nonexistent/libnvcomp.so.6"), "{text}");
    assert!(text.contains("pip install nvidia-libnvcomp-cu13") && text.contains(LIBRARY_ENV), "{text}");
}

#[test]
fn wheel_layout_is_found_under_python_roots() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join(WHEEL_DIR);
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join(SONAME), b"not really a library").unwrap();
    let other = tempfile::tempdir().unwrap();
    let found = wheel_candidates(&[other.path().to_path_buf(), dir.path().to_path_buf()]);
    assert_eq!(found, vec![lib.join(SONAME).to_string_lossy().into_owned()]);
    // A file that is not a library fails to load with its path in the error.
    let err = NvcompLibrary::load_first(&found).unwrap_err();
    assert!(err.tried[0].contains(SONAME), "{err}");
    // The system loader's name is always the last resort.
    let (found, _) = SearchPlaces::default().search(Vec::new);
    assert_eq!(found, vec![SONAME.to_string()]);
}

/// A fake wheel library under `dir/<package dir>`; its path.
fn fake_wheel(dir: &Path, package_dir: &str) -> String {
    let lib = dir.join(package_dir).join(WHEEL_DIR);
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join(SONAME), b"").unwrap();
    lib.join(SONAME).to_string_lossy().into_owned()
}

#[test]
fn the_wheel_is_found_wherever_pip_puts_it() {
    // Prefixes: a venv or conda environment, the user's ~/.local, system prefixes (lib64 too).
    for package_dir in [
        "lib/python3.12/site-packages",
        "lib/python3.10/dist-packages",
        "lib/python3/dist-packages",
        "lib64/python3.11/site-packages",
    ] {
        let prefix = tempfile::tempdir().unwrap();
        let want = fake_wheel(prefix.path(), package_dir);
        let places = SearchPlaces { prefixes: vec![prefix.path().to_path_buf()], ..SearchPlaces::default() };
        let (found, searched) = places.search(|| panic!("python3 asked although the wheel was found"));
        assert_eq!(found, vec![want, SONAME.to_string()], "{package_dir}");
        assert_eq!(searched, vec![prefix.path().join(package_dir)]);
    }
    // Directories a program adds (a Python interpreter's sys.path, run by its path without an
    // activated venv), PYTHONPATH's.
    let dir = tempfile::tempdir().unwrap();
    let want = fake_wheel(dir.path(), "venv/lib/python3.12/site-packages");
    let root = dir.path().join("venv/lib/python3.12/site-packages");
    let places = SearchPlaces { roots: vec![root], ..SearchPlaces::default() };
    assert_eq!(places.search(Vec::new).0, vec![want.clone(), SONAME.to_string()]);
    // The python3 on PATH, asked only when nothing else has it.
    let asked = dir.path().join("venv/lib/python3.12/site-packages");
    let (found, searched) = SearchPlaces::default().search(|| vec![asked.clone()]);
    assert_eq!(found, vec![want, SONAME.to_string()]);
    assert_eq!(searched, vec![asked]);
}

#[test]
fn python3_on_path_tells_its_package_directories() {
    let python = std::process::Command::new("python3").args(["-c", ""]).output();
    if python.is_ok_and(|o| o.status.success()) {
        let dirs = python3_package_dirs();
        assert!(dirs.iter().any(|d| d.ends_with("site-packages") || d.ends_with("dist-packages")), "{dirs:?}");
    }
}

#[test]
fn a_library_path_set_is_the_only_candidate() {
    let dir = tempfile::tempdir().unwrap();
    fake_wheel(dir.path(), "lib/python3.12/site-packages");
    let places = SearchPlaces {
        library: Some("/nonexistent/libnvcomp.so.6".into()),
        prefixes: vec![dir.path().to_path_buf()],
        ..SearchPlaces::default()
    };
    let (found, searched) = places.search(|| panic!("python3 asked although a library was named"));
    assert_eq!(found, vec!["/nonexistent/libnvcomp.so.6".to_string()]);
    assert!(searched.is_empty());
}

#[test]
fn the_error_names_where_it_looked() {
    let err = LoadError { tried: vec![format!("{SONAME} (not found)")], searched: vec!["/venv/site".into()] };
    let text = err.to_string();
    assert!(text.contains("/venv/site") && text.contains(WHEEL_DIR), "{text}");
}

#[test]
fn added_directories_are_searched_first() {
    let dir = tempfile::tempdir().unwrap();
    let want = fake_wheel(dir.path(), "site");
    add_search_dirs([dir.path().join("site")]);
    let places = SearchPlaces::from_env();
    assert_eq!(places.roots.first(), Some(&dir.path().join("site")));
    if places.library.is_none() {
        assert_eq!(places.search(Vec::new).0.first(), Some(&want));
    }
}

#[test]
fn relative_directories_are_never_searched() {
    // `""` (python -c, Jupyter) and relative sys.path entries would name the current
    // directory at the time of the first load.
    add_search_dirs([PathBuf::new(), PathBuf::from("relative/site")]);
    let added = ADDED_DIRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(added.iter().all(|d| d.is_absolute()), "{added:?}");
}

/// The library: the tests that use it are `#[ignore]`d (named in the summary as such) and run
/// where it is installed, as CI does with `--ignored`; asked for and absent, they fail.
fn installed() -> &'static NvcompLibrary {
    NvcompLibrary::get().unwrap_or_else(|err| panic!("this test needs nvCOMP: {err}"))
}

#[test]
#[ignore = "needs nvCOMP (NVCOMP_LIBRARY_PATH or pip install nvidia-libnvcomp-cu13); CI runs it"]
fn loads_version_six_with_status_strings() {
    let library = installed();
    assert_eq!(library.version() / 1000, MAJOR_VERSION, "{library:?}");
    assert!(library.version_string().starts_with("6."));
    assert!(library.cudart_version() >= 13000, "built with CUDA {}", library.cudart_version());
    assert!(library.status_string(sys::nvcompErrorCannotDecompress).contains("decompress"));
    assert!(library.check("x", sys::nvcompSuccess).is_ok());
    let err = library.check("decoding chunk c/0", sys::nvcompErrorInvalidValue).unwrap_err();
    assert!(err.to_string().contains("decoding chunk c/0") && err.status == sys::nvcompErrorInvalidValue, "{err}");
    assert!(!library.status_string(123_456).is_empty());
}

#[test]
#[ignore = "needs nvCOMP (NVCOMP_LIBRARY_PATH or pip install nvidia-libnvcomp-cu13); CI runs it"]
fn compression_bounds_hold_any_chunk_and_temp_sizes_grow_with_the_batch() {
    let library = installed();
    let no_gpu = !Path::new("/dev/nvidiactl").exists();
    let codecs =
        [Compressor::Zstd, Compressor::Deflate { algorithm: 0 }, Compressor::Gzip { algorithm: 0 }, Compressor::Lz4];
    for codec in codecs {
        let align = library.compress_alignments(codec).unwrap();
        for a in [align.input, align.output, align.temp] {
            assert!(a.is_power_of_two() && a <= 4096, "{codec:?} {align:?}");
        }
        // Every bound holds an incompressible chunk and its framing (DEFLATE's is generous:
        // 2.26 times the chunk).
        let bound = library.compress_max_output_chunk_size(codec, 1 << 20).unwrap();
        assert!(bound > 1 << 20 && bound < 4 << 20, "{codec:?}: {bound}");
        let small = library.compress_temp_size(codec, 16, 1 << 20, 16 << 20);
        let large = library.compress_temp_size(codec, 1024, 1 << 20, 1 << 30);
        match (small, large) {
            (Ok(small), Ok(large)) => assert!(large >= small, "{codec:?}: {small} then {large}"),
            // Sizes asked of the device's properties are a CUDA error without one (CI).
            (Err(err), _) | (_, Err(err)) => {
                assert!(no_gpu && err.status == sys::nvcompErrorCudaError, "{codec:?}: {err}");
            }
        }
    }
}

#[test]
#[ignore = "needs nvCOMP (NVCOMP_LIBRARY_PATH or pip install nvidia-libnvcomp-cu13); CI runs it"]
fn alignments_and_temp_sizes() {
    let library = installed();
    let gzip = |lookahead| Decompressor::Gzip { lookahead };
    for codec in [Decompressor::Zstd, Decompressor::Deflate, Decompressor::Lz4, gzip(false), gzip(true)] {
        let align = library.decompress_alignments(codec).unwrap();
        eprintln!("{codec:?}: {align:?}");
        for a in [align.input, align.output, align.temp] {
            assert!(a.is_power_of_two() && a <= 4096, "{codec:?} {align:?}");
        }
        let small = library.decompress_temp_size(codec, 100, 1 << 20, 100 << 20);
        // gzip sizes its temp memory from the device's properties: without a GPU (CI) that
        // is a CUDA error, which must come back as one.
        if let (Decompressor::Gzip { .. }, Err(err)) = (codec, &small) {
            if err.status == sys::nvcompErrorCudaError && !Path::new("/dev/nvidiactl").exists() {
                continue;
            }
        }
        let small = small.unwrap();
        let large = library.decompress_temp_size(codec, 1000, 1 << 20, 1000 << 20).unwrap();
        assert!(large >= small, "{codec:?} {small} {large}");
        // The pipeline relies on these: zstd and naive gzip input at any byte.
        if matches!(codec, Decompressor::Zstd | Decompressor::Gzip { lookahead: false }) {
            assert_eq!(align.input, 1, "{codec:?}");
        }
        // The brief's rule of thumb for zstd: about three times the decoded bytes.
        assert!(small < 8 * (100 << 20), "{codec:?} {small}");
    }
}

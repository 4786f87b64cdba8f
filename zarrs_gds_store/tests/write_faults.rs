//! Writes under faults: a writer killed mid-write, a write that runs out of space, and writers of
//! different chunks at once. Every chunk is left whole, its old value or its new one.
//!
//! Writers that must die, or run under a file size limit, are child processes: this test binary
//! run again with `ROLE` set, running only `child_process` (which does nothing without it).

use std::collections::BTreeSet;
use std::error::Error;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use zarrs::array::codec::{Crc32cCodec, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayToBytesCodecTraits, CodecOptions, IntoArrayBytes};
use zarrs_gds_store::{Durability, GdsStore, GdsStoreOptions};
use zarrs_storage::{
    Bytes, ListableStorageTraits, ReadableStorageTraits, StoreKey, StorePrefix, WritableStorageTraits,
};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// A child's role, its store's directory, its durability and its one number (a generation, a part).
const ROLE: &str = "WRITE_FAULTS_ROLE";
const DIR: &str = "WRITE_FAULTS_DIR";
const DURABILITY: &str = "WRITE_FAULTS_DURABILITY";
const ARG: &str = "WRITE_FAULTS_ARG";

/// Chunks of 256 KiB (64 x 1024 u32), 8 of them.
const CHUNK: [u64; 2] = [64, 1024];
const GRID: [u64; 2] = [2, 4];

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Chunk `k`'s values in generation `gen`: the generation first (a read says which one it is),
/// then noise zstd cannot shrink (a mix of two generations equals neither) or a ramp it can.
fn values(gen: u32, k: u64, chunk: [u64; 2], noise: bool) -> Vec<u32> {
    let value =
        |j: u64| if noise { splitmix(u64::from(gen) << 40 ^ k << 28 ^ j) as u32 } else { (j / 64) as u32 + gen };
    (0..chunk[0] * chunk[1]).map(|j| if j == 0 { gen } else { value(j) }).collect()
}

/// Each chunk of `grid`, with its number.
fn chunks(grid: [u64; 2]) -> impl Iterator<Item = (u64, [u64; 2])> {
    (0..grid[0] * grid[1]).map(move |k| (k, [k / grid[1], k % grid[1]]))
}

fn store(dir: &Path, durability: Durability) -> Result<Arc<GdsStore>> {
    Ok(Arc::new(GdsStore::new_with_options(dir, GdsStoreOptions::default().with_durability(durability))?))
}

/// A new u32 array of `grid` chunks of `chunk`, zstd then crc32c (a torn chunk fails its check).
fn create(dir: &Path, grid: [u64; 2], chunk: [u64; 2]) -> Result<Array<GdsStore>> {
    let array =
        ArrayBuilder::new(vec![grid[0] * chunk[0], grid[1] * chunk[1]], chunk.to_vec(), data_type::uint32(), 0u32)
            .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(1, false)), Arc::new(Crc32cCodec::new())])
            .build(store(dir, Durability::Sync)?, "/")?;
    array.store_metadata()?;
    Ok(array)
}

fn open(dir: &Path, durability: Durability) -> Result<Array<GdsStore>> {
    Ok(Array::open(store(dir, durability)?, "/")?)
}

/// A chunk's stored bytes, encoded by the array's codecs (for `GdsStore::set_many`).
fn encoded(array: &Array<GdsStore>, idx: [u64; 2], values: Vec<u32>) -> Result<(StoreKey, Vec<u8>)> {
    let bytes = values.into_array_bytes(array.data_type())?;
    let shape = array.chunk_shape(&idx)?;
    let raw = array.codecs().encode(bytes, &shape, array.data_type(), array.fill_value(), &CodecOptions::default())?;
    Ok((array.chunk_key(&idx), raw.into_owned()))
}

/// Every file under `dir`.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(files(&path)?);
        } else {
            found.push(path);
        }
    }
    Ok(found)
}

/// The store lists `zarr.json` and exactly `keys`, never a temporary file; any other file on disk
/// is a temporary one (a killed writer's). Returns how many of those there are.
fn check_listing(dir: &Path, keys: impl IntoIterator<Item = StoreKey>) -> Result<usize> {
    let mut expected: BTreeSet<String> = keys.into_iter().map(|key| key.as_str().to_owned()).collect();
    expected.insert("zarr.json".to_owned());
    let store = GdsStore::new(dir)?;
    let listed: BTreeSet<String> = store.list()?.iter().map(|key| key.as_str().to_owned()).collect();
    assert_eq!(listed, expected, "the store lists its values, and only them");
    let (mut temporary, mut values_size) = (0, 0);
    for file in files(dir)? {
        let name = file.strip_prefix(dir)?.to_string_lossy().into_owned();
        if expected.contains(&name) {
            values_size += std::fs::metadata(&file)?.len();
        } else {
            assert!(name.ends_with(".zarrs-tmp"), "{name}: neither a value nor a temporary file");
            temporary += 1;
        }
    }
    // Its size counts the values only, as its listing does.
    assert_eq!(store.size_prefix(&StorePrefix::root())?, values_size, "the store's size");
    Ok(temporary)
}

/// This test binary, to run `child_process` as `role`.
fn child(role: &str, dir: &Path, durability: Durability, arg: u64) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["child_process", "--exact", "--nocapture", "--test-threads=1", "--quiet"])
        .env(ROLE, role)
        .env(DIR, dir)
        .env(DURABILITY, format!("{durability:?}"))
        .env(ARG, arg.to_string());
    command
}

/// The body of the child processes; without `ROLE` (an ordinary test run), nothing.
#[test]
fn child_process() -> Result {
    let Ok(role) = std::env::var(ROLE) else { return Ok(()) };
    let dir = PathBuf::from(std::env::var(DIR)?);
    let durability = if std::env::var(DURABILITY)? == "NoSync" { Durability::NoSync } else { Durability::Sync };
    let arg: u64 = std::env::var(ARG)?.parse()?;
    match role.as_str() {
        "kill-writer" => kill_writer(&dir, durability, u32::try_from(arg)?),
        "fsize-writer" => fsize_writer(&dir),
        "part-writer" => write_part(&dir, arg).map_err(Into::into),
        _ => Err(format!("unknown role {role}").into()),
    }
}

/// Writes every chunk, pass after pass, until killed, printing `wrote P K` once pass P's write of
/// chunk K has returned: pass P writes generation `first + P % 3`, on even passes chunk by chunk
/// (`set`, as `store_chunk` does), on odd ones all at once (`set_many`, the device writer's way).
fn kill_writer(dir: &Path, durability: Durability, first: u32) -> Result {
    let array = open(dir, durability)?;
    let store = store(dir, durability)?;
    // Encoded beforehand, so that the writer's time goes to writing and kills land mid-write.
    let encode = |gen| chunks(GRID).map(|(k, idx)| encoded(&array, idx, values(gen, k, CHUNK, true))).collect();
    let generations: Vec<Vec<(StoreKey, Vec<u8>)>> = (first..first + 3).map(encode).collect::<Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(30); // in case the parent never kills it
    for pass in 0u64.. {
        let values = &generations[(pass % 3) as usize];
        if pass % 2 == 0 {
            for (k, (key, bytes)) in values.iter().enumerate() {
                store.set(key, Bytes::copy_from_slice(bytes))?;
                println!("wrote {pass} {k}");
            }
        } else {
            store.set_many(values)?;
            (0..values.len()).for_each(|k| println!("wrote {pass} {k}"));
        }
        if Instant::now() > deadline {
            return Err("not killed in time".into());
        }
    }
    Ok(())
}

/// `wrote P K` as (P, K).
fn parse_wrote(line: &str) -> Option<(u64, usize)> {
    let (pass, k) = line.strip_prefix("wrote ")?.split_once(' ')?;
    Some((pass.parse().ok()?, k.parse().ok()?))
}

/// A writer killed (SIGKILL) at several moments, in `set`s or `set_many`s: every chunk decodes
/// (its crc32c holds) to one whole generation, that of the last write of it that returned or of
/// the one after, and the store never lists a temporary file.
fn killed_writer_leaves_whole_chunks(durability: Durability) -> Result {
    let dir = tempfile::tempdir()?;
    let array = create(dir.path(), GRID, CHUNK)?;
    let mut gens = vec![0u32; chunks(GRID).count()];
    for (k, idx) in chunks(GRID) {
        array.store_chunk(&idx, values(0, k, CHUNK, true))?;
    }
    // A killed writer's leftover, planted so that hiding one is checked every round.
    std::fs::write(dir.path().join("c/0/.0.1.2.3.zarrs-tmp"), b"torn")?;
    let keys = || chunks(GRID).map(|(_, idx)| array.chunk_key(&idx));
    let mut temporary = 0;
    // Killed after the Nth reported write and a delay, so at different points of a write.
    for (round, (reports, delay_us)) in [(1, 0), (3, 300), (7, 1500), (12, 50), (20, 700)].into_iter().enumerate() {
        let first = 1000 * (round as u32 + 1);
        let mut writer = child("kill-writer", dir.path(), durability, first.into()).stdout(Stdio::piped()).spawn()?;
        let mut lines = BufReader::new(writer.stdout.take().expect("piped")).lines();
        let mut returned: Vec<Option<u64>> = vec![None; gens.len()];
        let mut seen = 0;
        while seen < reports {
            let line = lines.next().ok_or("the writer ended before it was killed")??;
            if let Some((pass, k)) = parse_wrote(&line) {
                returned[k] = Some(pass);
                seen += 1;
            }
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        writer.kill()?;
        assert!(!writer.wait()?.success(), "the writer was killed");
        // What the writer reported before it died (whole lines: each is one write to the pipe).
        for (pass, k) in lines.map_while(std::result::Result::ok).filter_map(|line| parse_wrote(&line)) {
            returned[k] = Some(pass);
        }
        for (k, idx) in chunks(GRID) {
            let k = k as usize;
            let read: Vec<u32> = array
                .retrieve_chunk(&idx)
                .map_err(|err| format!("{durability:?} round {round}: chunk {idx:?} does not decode: {err}"))?;
            let gen = read[0];
            // The last write that returned, or the one in flight after it.
            let expected = match returned[k] {
                None => [gens[k], first],
                Some(pass) => [first + (pass % 3) as u32, first + ((pass + 1) % 3) as u32],
            };
            let what = format!("{durability:?} round {round}: chunk {idx:?}");
            assert!(expected.contains(&gen), "{what} holds generation {gen}, not one of {expected:?}");
            assert!(read == values(gen, k as u64, CHUNK, true), "{what} is torn");
            gens[k] = gen;
        }
        temporary = check_listing(dir.path(), keys())?;
    }
    eprintln!("{durability:?}: {temporary} temporary files on disk (1 planted), none listed");
    Ok(())
}

#[test]
fn a_killed_writer_leaves_every_chunk_old_or_new_sync() -> Result {
    killed_writer_leaves_whole_chunks(Durability::Sync)
}

#[test]
fn a_killed_writer_leaves_every_chunk_old_or_new_nosync() -> Result {
    killed_writer_leaves_whole_chunks(Durability::NoSync)
}

/// Chunks of 512 KiB (256 x 512 u32) under a file size limit of 512 KiB: a ramp chunk is written,
/// a noise chunk (incompressible, so larger than the limit once encoded) fails with EFBIG.
const BIG: [u64; 2] = [256, 512];
const FSIZE_LIMIT: u64 = 512 << 10;

/// Writes ramp chunks 0..4, then noise over chunk 2 (`store_chunk`), then ramp over chunk 0 with
/// noise over chunk 3 (`set_many`), printing each error (both writes must fail).
fn fsize_writer(dir: &Path) -> Result {
    // Without root there is no small filesystem to fill: the process's file size limit stands in
    // (EFBIG, like ENOSPC, fails a write part way), SIGXFSZ ignored so the write returns the error.
    let limit = libc::rlimit { rlim_cur: FSIZE_LIMIT, rlim_max: FSIZE_LIMIT };
    // SAFETY: plain system calls on this process, no memory handed over but `limit`.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &raw const limit), 0, "setrlimit");
    }
    let array = create(dir, [1, 4], BIG)?;
    for (k, idx) in chunks([1, 4]) {
        array.store_chunk(&idx, values(1, k, BIG, false))?;
    }
    let err = array.store_chunk(&[0, 2], values(2, 2, BIG, true)).expect_err("a chunk over the limit");
    println!("error: {err}");
    let both = [encoded(&array, [0, 0], values(2, 0, BIG, false))?, encoded(&array, [0, 3], values(2, 3, BIG, true))?];
    let err = store(dir, Durability::Sync)?.set_many(&both).expect_err("a chunk over the limit");
    println!("error: {err}");
    Ok(())
}

/// A write that fails part way (EFBIG) is an error naming its chunk; every chunk keeps the value
/// it had, those the failed writes would have replaced included, and no temporary file is left.
#[test]
fn a_write_past_the_size_limit_names_its_chunk_and_keeps_the_old_values() -> Result {
    let dir = tempfile::tempdir()?;
    let out = child("fsize-writer", dir.path(), Durability::Sync, 0).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the writer failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let errors: Vec<&str> = stdout.lines().filter_map(|line| line.strip_prefix("error: ")).collect();
    assert_eq!(errors.len(), 2, "{stdout}");
    let efbig = format!("os error {}", libc::EFBIG);
    for (err, key) in errors.iter().zip(["c/0/2", "c/0/3"]) {
        assert!(err.contains(&format!("writing {key} ")) && err.contains(&efbig), "names {key} and EFBIG: {err}");
    }
    let array = open(dir.path(), Durability::Sync)?;
    for (k, idx) in chunks([1, 4]) {
        // Chunk 0 too: a set_many renames nothing until every value is written.
        assert!(array.retrieve_chunk::<Vec<u32>>(&idx)? == values(1, k, BIG, false), "chunk {idx:?} kept");
    }
    assert_eq!(check_listing(dir.path(), chunks([1, 4]).map(|(_, idx)| array.chunk_key(&idx)))?, 0);
    Ok(())
}

/// A 2 MiB tmpfs mounted on a directory, unmounted when dropped (a failed test too).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> Self {
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"]).arg(dir).output();
        match out {
            Ok(out) if out.status.success() => Self(dir.to_path_buf()),
            Ok(out) => panic!(
                "mounting a 2 MiB tmpfs on {} failed ({}: {}): this test needs root",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => panic!("running mount failed ({err}): this test needs mount(8) and root"),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if !Command::new("umount").arg(&self.0).status().is_ok_and(|status| status.success()) {
            eprintln!("could not unmount the tmpfs on {}", self.0.display());
        }
    }
}

/// A full filesystem: chunk writes until one fails with ENOSPC naming its chunk; every chunk
/// written before reads back equal, and no temporary or torn file is listed or left.
#[test]
#[ignore = "needs root to mount a small tmpfs"]
fn a_full_filesystem_fails_the_write_naming_its_chunk() -> Result {
    let dir = tempfile::tempdir()?;
    let _tmpfs = Tmpfs::mount(dir.path()); // dropped (unmounted) before `dir`
    let grid = [4, 4]; // 16 chunks of 256 KiB of noise: twice the tmpfs
    let array = create(dir.path(), grid, CHUNK)?;
    let mut written = Vec::new();
    let mut failed = None;
    for (k, idx) in chunks(grid) {
        match array.store_chunk(&idx, values(1, k, CHUNK, true)) {
            Ok(()) => written.push((k, idx)),
            Err(err) => {
                failed = Some((idx, err.to_string()));
                break;
            }
        }
    }
    let (idx, err) = failed.expect("4 MiB of chunks do not fit in a 2 MiB tmpfs");
    eprintln!("{} chunks written, then: {err}", written.len());
    let key = array.chunk_key(&idx);
    let enospc = format!("os error {}", libc::ENOSPC);
    assert!(err.contains(&format!("writing {key} ")) && err.contains(&enospc), "names {key} and ENOSPC: {err}");
    assert!(written.len() >= 4, "{} chunks written before the tmpfs was full", written.len());
    for &(k, idx) in &written {
        assert!(array.retrieve_chunk::<Vec<u32>>(&idx)? == values(1, k, CHUNK, true), "chunk {idx:?} reads back");
    }
    assert_eq!(check_listing(dir.path(), written.iter().map(|(_, idx)| array.chunk_key(idx)))?, 0);
    Ok(())
}

/// Writer `part` (0 or 1): generations 1 to 3 of the chunks in columns of its parity, so both
/// writers make the same directories (`c/0`, `c/1`) at once.
fn write_part(dir: &Path, part: u64) -> std::result::Result<(), String> {
    let array = open(dir, Durability::Sync).map_err(|err| err.to_string())?;
    for gen in 1..=3 {
        for (k, idx) in chunks(GRID).filter(|(_, idx)| idx[1] % 2 == part) {
            array.store_chunk(&idx, values(gen, k, CHUNK, true)).map_err(|err| format!("part {part}: {err}"))?;
        }
    }
    Ok(())
}

/// Two writers of disjoint chunks of one array at once, two threads (each its own `Array`) and
/// then two processes: every chunk holds its writer's last value.
#[test]
fn two_writers_of_different_chunks_both_land() -> Result {
    for processes in [false, true] {
        let dir = tempfile::tempdir()?;
        let array = create(dir.path(), GRID, CHUNK)?;
        if processes {
            let writers: Vec<_> = (0..2)
                .map(|part| {
                    child("part-writer", dir.path(), Durability::Sync, part)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()
                })
                .collect::<std::io::Result<_>>()?;
            for writer in writers {
                let out = writer.wait_with_output()?;
                let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                assert!(out.status.success(), "a writer process failed: {stdout}{stderr}");
            }
        } else {
            let start = Barrier::new(2);
            std::thread::scope(|scope| {
                let writers: Vec<_> = (0..2)
                    .map(|part| {
                        let (start, dir) = (&start, dir.path());
                        scope.spawn(move || {
                            start.wait();
                            write_part(dir, part)
                        })
                    })
                    .collect();
                writers.into_iter().try_for_each(|writer| writer.join().expect("a writer thread panicked"))
            })?;
        }
        for (k, idx) in chunks(GRID) {
            let read: Vec<u32> = array.retrieve_chunk(&idx)?;
            assert!(read == values(3, k, CHUNK, true), "processes {processes}: chunk {idx:?} holds {}", read[0]);
        }
        assert_eq!(check_listing(dir.path(), chunks(GRID).map(|(_, idx)| array.chunk_key(&idx)))?, 0);
    }
    Ok(())
}

/// A read-modify-write whose value another writer replaced after the read (another process, in
/// practice: within one, writers hold `KeyLocks`) is refused with an error naming the key, and
/// keeps the other writer's bytes; an erase likewise. Unchanged, both go through.
#[test]
fn a_value_replaced_after_it_was_read_is_never_overwritten() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let other = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0/1")?;
    for missing in [true, false] {
        if !missing {
            store.set(&key, Bytes::from_static(b"first"))?;
        }
        let (old, version) = store.get_versioned(&key)?;
        assert_eq!(old.is_none(), missing);
        // Another writer (another store of the directory: another process's view) replaces it.
        other.set(&key, Bytes::from_static(b"theirs"))?;
        let err = store.set_many_checked(&[(key.clone(), b"mine".to_vec())], &[Some(version)]).unwrap_err();
        assert!(err.to_string().contains("c/0/1") && err.to_string().contains("changed"), "{err}");
        assert_eq!(store.get(&key)?.as_deref(), Some(&b"theirs"[..]), "missing {missing}");
        let err = store.erase_checked(&key, Some(version)).unwrap_err();
        assert!(err.to_string().contains("c/0/1"), "{err}");
        assert_eq!(store.get(&key)?.as_deref(), Some(&b"theirs"[..]));
        store.erase(&key)?;
    }
    // Unchanged since the read: replaced, then erased.
    store.set(&key, Bytes::from_static(b"first"))?;
    let (_, version) = store.get_versioned(&key)?;
    store.set_many_checked(&[(key.clone(), b"second".to_vec())], &[Some(version)])?;
    assert_eq!(store.get(&key)?.as_deref(), Some(&b"second"[..]));
    let (_, version) = store.get_versioned(&key)?;
    store.erase_checked(&key, Some(version))?;
    assert!(store.get(&key)?.is_none());
    assert_eq!(temps_left(dir.path())?, 0);
    Ok(())
}

/// Two threads read, change their own half of one value and write it again, 20 rounds each, on
/// two stores of one directory: holding `KeyLocks`, both halves land every round; without them,
/// every round either lands both or refuses one writer with a conflict (never a silent loss).
#[test]
fn read_modify_writes_of_one_value_lose_no_update() -> Result {
    use zarrs_gds_store::KeyLocks;
    for locked in [true, false] {
        let dir = tempfile::tempdir()?;
        let key = StoreKey::new("c/0")?;
        let (mut landed, mut refused) = (0, 0);
        for round in 0..20u8 {
            GdsStore::new(dir.path())?.set(&key, Bytes::from(vec![0u8; 2 << 16]))?;
            let start = Barrier::new(2);
            let results: Vec<bool> = std::thread::scope(|scope| {
                let writers: Vec<_> = (0..2usize)
                    .map(|half| {
                        let (start, dir, key) = (&start, dir.path(), &key);
                        scope.spawn(move || -> std::result::Result<bool, String> {
                            let store = GdsStore::new(dir).map_err(|e| e.to_string())?;
                            start.wait();
                            let _held = locked.then(|| KeyLocks::lock([store.lock_id(key)]));
                            let (old, version) = store.get_versioned(key).map_err(|e| e.to_string())?;
                            let mut value = old.expect("stored").to_vec();
                            value[half << 16..(half + 1) << 16].fill(round + 1);
                            match store.set_many_checked(&[(key.clone(), value)], &[Some(version)]) {
                                Ok(()) => Ok(true),
                                Err(err) if err.to_string().contains("changed") && !locked => Ok(false),
                                Err(err) => Err(err.to_string()),
                            }
                        })
                    })
                    .collect();
                writers.into_iter().map(|w| w.join().expect("a writer panicked")).collect::<std::result::Result<_, _>>()
            })?;
            let value = GdsStore::new(dir.path())?.get(&key)?.expect("stored");
            for (half, &wrote) in results.iter().enumerate() {
                let landed_here = value[half << 16..(half + 1) << 16].iter().all(|&b| b == round + 1);
                assert_eq!(landed_here, wrote, "locked {locked}, round {round}: half {half} wrote {wrote}");
                if wrote {
                    landed += 1;
                } else {
                    refused += 1;
                }
            }
        }
        eprintln!("locked {locked}: {landed} landed, {refused} refused as conflicts");
        if locked {
            assert_eq!((landed, refused), (40, 0));
        }
        assert_eq!(temps_left(dir.path())?, 0);
    }
    Ok(())
}

/// A killed writer's temporary file (old, no writer holding its lock) is removed by the next
/// write into its directory; a live writer's (locked) and a fresh one are left alone.
#[test]
fn a_killed_writers_temporary_files_are_cleaned_never_a_live_ones() -> Result {
    let dir = tempfile::tempdir()?;
    let sub = dir.path().join("c/0");
    std::fs::create_dir_all(&sub)?;
    let temp = |name: &str| sub.join(format!(".{name}.12345.1a2b.0.zarrs-tmp"));
    let old = std::time::SystemTime::now() - Duration::from_hours(1);
    let (dead, live, fresh) = (temp("1"), temp("2"), temp("3"));
    for path in [&dead, &live, &fresh] {
        std::fs::write(path, b"partial")?;
    }
    for path in [&dead, &live] {
        std::fs::File::options().write(true).open(path)?.set_modified(old)?;
    }
    // A live writer holds the lock of its temporary file until it is renamed.
    let held = std::fs::File::open(&live)?;
    held.lock()?;
    let store = GdsStore::new(dir.path())?;
    store.set(&StoreKey::new("c/0/0")?, Bytes::from_static(b"value"))?;
    assert!(!dead.exists(), "the killed writer's temporary file is left");
    assert!(live.exists() && fresh.exists(), "a live or fresh temporary file was removed");
    drop(held);
    Ok(())
}

/// A value written again keeps its file's mode (a rewrite is a new file renamed over the old).
#[test]
fn a_rewrite_keeps_the_files_mode() -> Result {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0/0")?;
    store.set(&key, Bytes::from_static(b"first"))?;
    let path = store.key_to_fspath(&key);
    for mode in [0o640, 0o604, 0o444] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        store.set(&key, Bytes::from_static(b"again"))?;
        assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o7777, mode);
        assert_eq!(store.get(&key)?.as_deref(), Some(&b"again"[..]));
    }
    Ok(())
}

/// Temporary files of writes under `dir`.
fn temps_left(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            n += temps_left(&entry.path())?;
        } else if entry.file_name().to_string_lossy().ends_with(".zarrs-tmp") {
            n += 1;
        }
    }
    Ok(n)
}

//! Read-ahead advice: files (or ranges of them) a read will need next, handed to the kernel with
//! `posix_fadvise(POSIX_FADV_WILLNEED)` by a few background threads, so that a cold disk reads
//! them while the reader checks and decodes what it has. Advice only: nothing is read into the
//! caller's memory, a file that cannot be opened is skipped, and the data read later is whatever
//! the file then holds.

use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// Threads that open and advise files: opening a file whose inode is not cached waits for the
/// disk, so one thread would trail the reads it is meant to lead.
const ADVISERS: usize = 8;

/// One piece of advice: `len` bytes of the file at `path` from `offset` (0: to its end).
pub(crate) struct Advice {
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// The advisers' queue, started on first use.
fn queue() -> &'static Mutex<Sender<Advice>> {
    static QUEUE: OnceLock<Mutex<Sender<Advice>>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (send, receive) = channel::<Advice>();
        let receive = Arc::new(Mutex::new(receive));
        for i in 0..ADVISERS {
            let receive = receive.clone();
            // A thread that cannot start leaves the advice to the others (or to none): reads
            // stay correct, only slower.
            let _ =
                std::thread::Builder::new().name(format!("zarrs-gds-advise-{i}")).spawn(move || advise_loop(&receive));
        }
        Mutex::new(send)
    })
}

fn advise_loop(receive: &Mutex<Receiver<Advice>>) {
    loop {
        let next = receive.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
        let Ok(advice) = next else { return };
        if let Ok(file) = std::fs::File::open(&advice.path) {
            let (Ok(offset), Ok(len)) = (libc::off_t::try_from(advice.offset), libc::off_t::try_from(advice.len))
            else {
                continue;
            };
            // SAFETY: a valid descriptor of an open file; advice has no effect on memory.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED) };
        }
    }
}

/// Queue `advice` for the background advisers; returns at once.
pub(crate) fn advise(advice: impl IntoIterator<Item = Advice>) {
    let queue = queue().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for a in advice {
        if queue.send(a).is_err() {
            return;
        }
    }
}

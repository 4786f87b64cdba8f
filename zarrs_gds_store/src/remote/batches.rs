//! Batches of whole values fetched in the background as one stream of GETs, a reader taking
//! them in order ([`RemoteStore::fetch_value_batches`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use zarrs_storage::{Bytes, StorageError, StoreKey};

use super::{block_on, runtime, RemoteStore};

impl RemoteStore {
    /// [`Self::fetch_values`] of several batches, fetched in the background as one stream of
    /// GETs (at most the store's concurrency in flight, running on into the next batch while the
    /// last GETs of one come back), never more than `ahead` batches beyond the one last taken:
    /// a reader decodes one batch while the next is fetched. Take them in order with
    /// [`ValueBatches::next_batch`]; dropping it stops the GETs.
    pub fn fetch_value_batches(&self, batches: Vec<Vec<(StoreKey, u64)>>, ahead: usize) -> ValueBatches {
        let (senders, receivers): (Vec<_>, Vec<_>) = batches.iter().map(|_| tokio::sync::oneshot::channel()).unzip();
        let taken = Arc::new(tokio::sync::Semaphore::new(ahead.saturating_add(1)));
        let task = runtime().spawn(fetch_batches(self.clone(), batches, senders, Arc::clone(&taken)));
        ValueBatches {
            name: self.name.clone(),
            results: receivers.into_iter().map(Some).collect(),
            next: 0,
            taken,
            task,
        }
    }
}

/// One batch's values from [`RemoteStore::fetch_value_batches`], or the error that stopped them.
type BatchValues = Result<Vec<Option<Bytes>>, StorageError>;

/// Batches of whole values being fetched in the background ([`RemoteStore::fetch_value_batches`]).
pub struct ValueBatches {
    /// The store's name, for messages.
    name: String,
    /// Per batch, where its values arrive (None once taken).
    results: Vec<Option<tokio::sync::oneshot::Receiver<BatchValues>>>,
    next: usize,
    /// A permit per batch the fetch may start: `ahead + 1` at first, one more per batch taken.
    taken: Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl ValueBatches {
    /// The next batch's values (per key its bytes, None: missing), waiting for them; None after
    /// the last batch.
    ///
    /// # Errors
    /// The first failed request's error, naming its key: for its batch, and (as a message) for
    /// every batch not complete when it failed.
    pub fn next_batch(&mut self) -> Option<BatchValues> {
        let receiver = self.results.get_mut(self.next)?.take()?;
        self.next += 1;
        let got = block_on(receiver);
        self.taken.add_permits(1);
        Some(got.unwrap_or_else(|_| Err(StorageError::Other(format!("{}: the background fetch stopped", self.name)))))
    }
}

impl Drop for ValueBatches {
    fn drop(&mut self) {
        // A read that ends early (an error, a panic) leaves no GETs running for nothing.
        self.task.abort();
    }
}

impl fmt::Debug for ValueBatches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueBatches").field("name", &self.name).field("next", &self.next).finish_non_exhaustive()
    }
}

/// The task of [`RemoteStore::fetch_value_batches`]: every batch's keys in order through one
/// stream of GETs, batch `k` started once its permit is granted, each batch sent as it completes.
async fn fetch_batches(
    store: RemoteStore,
    batches: Vec<Vec<(StoreKey, u64)>>,
    senders: Vec<tokio::sync::oneshot::Sender<BatchValues>>,
    taken: Arc<tokio::sync::Semaphore>,
) {
    let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
    let mut values: Vec<Vec<Option<Bytes>>> = batches.iter().map(|b| vec![None; b.len()]).collect();
    let mut left: Vec<usize> = batches.iter().map(Vec::len).collect();
    // A batch with no keys is complete before any GET.
    for (k, sender) in senders.iter_mut().enumerate() {
        if left[k] == 0 {
            if let Some(sender) = sender.take() {
                let _ = sender.send(Ok(Vec::new()));
            }
        }
    }
    // Owned keys and shared handles: the task is spawned, so nothing here borrows.
    let concurrency = store.concurrency;
    let store = Arc::new(store);
    let keys = futures::stream::iter(batches.into_iter().enumerate())
        .then(move |(k, batch)| {
            let taken = Arc::clone(&taken);
            async move {
                // Closed only if the semaphore is dropped, which its owner never does first.
                if let Ok(permit) = taken.acquire().await {
                    permit.forget();
                }
                futures::stream::iter(batch.into_iter().enumerate().map(move |(i, (key, limit))| (k, i, key, limit)))
            }
        })
        .flatten();
    // Each GET its own task: bodies are gathered on every worker of the runtime, not all on the
    // one that runs this task (which also serves connections).
    let mut done = std::pin::pin!(keys
        .map(move |(k, i, key, limit)| {
            let store = Arc::clone(&store);
            Spawned(runtime().spawn(async move { (k, i, store.fetch_value(&key, limit).await) }))
        })
        .buffer_unordered(concurrency));
    while let Some((k, i, result)) = done.next().await {
        match result {
            Ok(value) => {
                values[k][i] = value;
                left[k] -= 1;
                if left[k] == 0 {
                    if let Some(sender) = senders[k].take() {
                        let _ = sender.send(Ok(std::mem::take(&mut values[k])));
                    }
                }
            }
            Err(err) => {
                let message = err.to_string();
                if let Some(sender) = senders[k].take() {
                    let _ = sender.send(Err(err));
                }
                for sender in senders.iter_mut().filter_map(Option::take) {
                    let _ =
                        sender.send(Err(StorageError::Other(format!("not fetched after an earlier error: {message}"))));
                }
                return;
            }
        }
    }
}

/// A task spawned on the remote runtime, awaited for its output and aborted when dropped (a
/// stopped fetch leaves no GET running for nothing).
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Future for Spawned<T> {
    type Output = T;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|joined| match joined {
            Ok(output) => output,
            // Its panic is the awaiting task's; it is never aborted while awaited.
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        })
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

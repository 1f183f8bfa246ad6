//! The queue between the threads that pack a checkpoint's tensors and the
//! one that uploads them (`pipeline`), and the load's shared counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Result, anyhow};
use kestrel_core::{Backend, HostWeight};

/// A packed tensor on its way to the uploading thread, and where its
/// weight goes back.
pub struct UploadRequest<B: Backend> {
    pub tensor: HostWeight<'static>,
    pub reply: mpsc::Sender<kestrel_core::Result<B::Weight>>,
}

/// Byte and time counts of a load, shared by its threads.
#[derive(Default)]
pub struct Counters {
    checkpoint_bytes: AtomicU64,
    packed_bytes: AtomicU64,
    pack_nanos: AtomicU64,
}

impl Counters {
    pub fn read(&self, bytes: usize) {
        self.checkpoint_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn packed(&self, bytes: usize, since: Instant) {
        self.packed_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.pack_nanos
            .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn checkpoint_bytes(&self) -> u64 {
        self.checkpoint_bytes.load(Ordering::Relaxed)
    }

    pub fn packed_bytes(&self) -> u64 {
        self.packed_bytes.load(Ordering::Relaxed)
    }

    pub fn pack_seconds(&self) -> f64 {
        self.pack_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// The upload of `tensor` through the queue: blocks until it is done.
pub fn upload_queued<B: Backend>(
    queue: &mpsc::SyncSender<UploadRequest<B>>,
    tensor: HostWeight<'static>,
) -> Result<B::Weight> {
    let (reply, answer) = mpsc::channel();
    queue
        .send(UploadRequest { tensor, reply })
        .map_err(|_| anyhow!("the uploading thread stopped"))?;
    let weight = answer
        .recv()
        .map_err(|_| anyhow!("the uploading thread stopped"))?;
    Ok(weight?)
}

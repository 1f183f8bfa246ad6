//! Recorded steps (CUDA graphs): a keyed step runs eagerly the first time,
//! is captured into a graph the second time, and is replayed from then on.
//!
//! The first, eager run warms everything a capture must not do (lazy module
//! state, allocator growth) and tells the shape of the result, so that the
//! result's persistent buffer can be allocated before the capture. Inside the
//! capture every intermediate tensor is allocated and freed on the stream,
//! which makes those allocations part of the graph; the result is copied into
//! the persistent buffer before it is freed.
//!
//! A recording reads the step layout at fixed addresses (see `step.rs`), the
//! cache it was recorded with, and the weights of the model that recorded it;
//! the entry key covers all three (the step key names the model).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};
use kestrel_core::StepKey;

use crate::cache::CudaCache;
use crate::device::{Gpu, check, ptr};
use crate::tensor::CudaTensor;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct EntryKey {
    step: StepKey,
    cache: u64,
    generation: u64,
}

enum Entry {
    /// Ran once eagerly; the result had this shape.
    Seen { rows: usize, cols: usize },
    /// The driver refused the recording: this step always runs eagerly.
    Eager,
    Recorded {
        graph: CudaGraph,
        out: CudaSlice<f32>,
        rows: usize,
        cols: usize,
    },
}

// The graph handles are used only under the backend's mutex, one at a time.
unsafe impl Send for Entry {}

#[derive(Default)]
pub struct Recordings {
    entries: HashMap<EntryKey, Entry>,
    /// The cache the entries were recorded with; a different cache drops them.
    cache: Option<u64>,
    generation: u64,
    pub captures: u64,
    pub replays: u64,
}

impl Recordings {
    /// Run the step `f` (whose layout the step buffer of `generation` holds) under `key`.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        generation: u64,
        key: StepKey,
        cache: &mut CudaCache,
        f: &mut dyn FnMut(&mut CudaCache) -> CudaTensor,
    ) -> CudaTensor {
        if self.cache != Some(cache.id) || self.generation != generation {
            // Recordings of another cache or of a moved step buffer read
            // addresses that are gone.
            self.entries.clear();
            self.cache = Some(cache.id);
            self.generation = generation;
        }
        let k = EntryKey {
            step: key,
            cache: cache.id,
            generation,
        };
        match self.entries.get(&k) {
            None => {
                let out = f(cache);
                self.entries.insert(
                    k,
                    Entry::Seen {
                        rows: out.rows,
                        cols: out.cols,
                    },
                );
                out
            }
            Some(Entry::Eager) => f(cache),
            Some(&Entry::Seen { rows, cols }) => {
                let out = gpu.alloc::<f32>(rows * cols);
                let Some(graph) = capture(gpu, cache, f, &out, rows, cols) else {
                    // Nothing of the refused recording ran: run the step now.
                    self.entries.insert(k, Entry::Eager);
                    return f(cache);
                };
                self.captures += 1;
                self.entries.insert(
                    k,
                    Entry::Recorded {
                        graph,
                        out,
                        rows,
                        cols,
                    },
                );
                self.replay(gpu, &k)
            }
            Some(Entry::Recorded { .. }) => self.replay(gpu, &k),
        }
    }

    fn replay(&mut self, gpu: &Gpu, k: &EntryKey) -> CudaTensor {
        let Some(Entry::Recorded {
            graph,
            out,
            rows,
            cols,
        }) = self.entries.get(k)
        else {
            unreachable!("replay of a step that was not recorded")
        };
        check(graph.launch(), "graph launch");
        self.replays += 1;
        // A fresh tensor: the caller owns its result, the recording keeps its buffer.
        let n = rows * cols;
        let copy = gpu.alloc::<f32>(n);
        gpu.copy_dtod(ptr(&copy, &gpu.stream), ptr(out, &gpu.stream), n * 4);
        CudaTensor {
            bf16: None,
            rows: *rows,
            cols: *cols,
            buf: copy,
        }
    }
}

/// Record `f` into a graph whose result lands in `out`; `None` when the
/// driver cannot build or instantiate the graph (the recorded work did not
/// run). An operation that fails while recording still panics: that is a
/// bug in the operation, not a limit of the driver.
fn capture(
    gpu: &Gpu,
    cache: &mut CudaCache,
    f: &mut dyn FnMut(&mut CudaCache) -> CudaTensor,
    out: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Option<CudaGraph> {
    check(
        gpu.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "begin graph capture",
    );
    gpu.capturing.store(true, Ordering::Relaxed);
    let result = f(cache);
    assert_eq!(
        (result.rows, result.cols),
        (rows, cols),
        "a recorded step changed its result's shape"
    );
    gpu.copy_dtod(
        ptr(out, &gpu.stream),
        ptr(&result.buf, &gpu.stream),
        rows * cols * 4,
    );
    drop(result);
    gpu.capturing.store(false, Ordering::Relaxed);
    let graph = gpu
        .stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .ok()
        .flatten()?;
    graph.upload().ok()?;
    Some(graph)
}

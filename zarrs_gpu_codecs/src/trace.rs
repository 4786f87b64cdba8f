//! Stage timings of a retrieval: kept in its report ([`RetrieveReport::stages`]), and printed to
//! stderr when the configuration asks (`GpuConfig::with_trace`, `ZARRS_GPU_TRACE`): where the
//! time of a read goes, without a profiler. A mark costs a clock read, a few per batch.

use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::RetrieveReport;

/// The time a read spent in one of its stages, summed over its batches.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StageTime {
    /// The stage (`plan`, `read`, `check`, `decode`, `place`, `final sync`, ...).
    pub stage: &'static str,
    /// Time spent in it, on the host's clock (device work shows where the host waits for it).
    pub time: Duration,
    /// How many times the stage ran (once per batch for most).
    pub count: usize,
}

pub(crate) struct Trace {
    start: Instant,
    last: Instant,
    print: bool,
    stages: Vec<StageTime>,
}

impl Trace {
    pub(crate) fn new(print: bool) -> Self {
        let now = Instant::now();
        Self { start: now, last: now, print, stages: Vec::new() }
    }

    /// Close the stage that ends now (summed with earlier ones of the same name).
    pub(crate) fn mark(&mut self, stage: &'static str) {
        let now = Instant::now();
        let time = now - self.last;
        self.last = now;
        match self.stages.iter_mut().find(|s| s.stage == stage) {
            Some(s) => {
                s.time += time;
                s.count += 1;
            }
            None => self.stages.push(StageTime { stage, time, count: 1 }),
        }
    }

    /// The stages, printed first when asked.
    pub(crate) fn finish(self, what: &str) -> Vec<StageTime> {
        if self.print {
            let stages: Vec<String> = self
                .stages
                .iter()
                .map(|s| format!("{} {:.2} ms (x{})", s.stage, s.time.as_secs_f64() * 1e3, s.count))
                .collect();
            eprintln!(
                "[zarrs_gpu trace] {what}: {:.2} ms: {}",
                self.start.elapsed().as_secs_f64() * 1e3,
                stages.join(", ")
            );
        }
        self.stages
    }
}

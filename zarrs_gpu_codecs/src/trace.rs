//! Phase timings of a retrieval, printed to stderr when the configuration asks for them
//! (`GpuConfig::with_trace`, `ZARRS_GPU_TRACE`): where the time of a read goes, without a profiler.

use std::time::Instant;

pub(crate) struct Trace {
    start: Instant,
    last: Instant,
    marks: Option<Vec<(&'static str, f64)>>,
}

impl Trace {
    pub(crate) fn new(on: bool) -> Self {
        let now = Instant::now();
        Self { start: now, last: now, marks: on.then(Vec::new) }
    }

    /// Close the phase that ends now.
    pub(crate) fn mark(&mut self, phase: &'static str) {
        if let Some(marks) = &mut self.marks {
            let now = Instant::now();
            marks.push((phase, (now - self.last).as_secs_f64() * 1e3));
            self.last = now;
        }
    }

    /// Print the phases, summing those of the same name.
    pub(crate) fn finish(self, what: &str) {
        let Some(marks) = self.marks else { return };
        let mut sums: Vec<(&str, f64, usize)> = Vec::new();
        for (phase, ms) in marks {
            match sums.iter_mut().find(|s| s.0 == phase) {
                Some(s) => {
                    s.1 += ms;
                    s.2 += 1;
                }
                None => sums.push((phase, ms, 1)),
            }
        }
        let phases: Vec<String> = sums.iter().map(|(p, ms, n)| format!("{p} {ms:.2} ms (x{n})")).collect();
        eprintln!(
            "[zarrs_gpu trace] {what}: {:.2} ms: {}",
            self.start.elapsed().as_secs_f64() * 1e3,
            phases.join(", ")
        );
    }
}

//! Who decodes what: nvCOMP or host threads.
//!
//! nvCOMP's batched decoders have a latency of about one frame's serial decode (on an H200 a
//! 1 MiB zstd frame takes 17 ms alone and 23 ms with 255 others; a 16 MiB frame about 300 ms),
//! then a high throughput over many frames (4096 frames of 1 MiB in 60 to 68 ms). A host thread
//! decodes a 1 MiB frame in about 2 ms. So a few dozen frames finish sooner on host threads,
//! thousands on the device, and in between both take a share so that they finish together.

use std::sync::atomic::{AtomicU64, Ordering};

/// Chunks at least this large (decoded) may be decoded on host threads: one large zstd frame
/// decodes largely serially on the GPU.
pub(crate) const LARGE_CHUNK: u64 = 4 << 20;

/// The rates the split between nvCOMP and host threads comes from. The defaults are an H200's
/// (zstd level 3 of float32 data; nvCOMP 6); set them with
/// [`GpuConfig::with_decode_rates`](crate::GpuConfig::with_decode_rates) for another machine or
/// codec. Without them, the host thread rate is learned from the host's own decodes as they run.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct DecodeRates {
    /// nvCOMP's fixed cost per batched call, in seconds.
    pub device_call_s: f64,
    /// How fast one frame decodes on the device, bytes a second: a batch takes at least its
    /// largest frame's size over this (one frame decodes largely serially).
    pub device_frame_rate: f64,
    /// Whether a batch whose frames are all smaller than 4 MiB decoded stays wholly on the
    /// device (but where host threads decode it all within the device's fixed cost): true where
    /// the device's decoder is no slower than host threads at any count of such frames (our zstd
    /// decoder), false (the default) where the rates split them. Batches with larger frames
    /// split by the rates either way; batches that do not split teach no slowness.
    pub small_frames_on_device: bool,
    /// nvCOMP's throughput over a batch's frames, bytes a second.
    pub device_rate: f64,
    /// One host thread's decode rate, bytes a second.
    pub host_thread_rate: f64,
}

pub(crate) const MIB: f64 = (1u64 << 20) as f64;
pub(crate) const GIB: f64 = (1u64 << 30) as f64;

impl Default for DecodeRates {
    /// An H200 with nvCOMP 6, zstd level 3 of float32 data: batches of 1 MiB frames took 17.1,
    /// 19.5, 23.1, 27.6 and 60 to 67.5 ms for 1, 16, 256, 1024 and 4096 frames, 128 KiB frames
    /// 4.1 ms for one, 16 KiB ones 1.1 ms; 512 frames of 16 MiB about 330 ms. A host thread
    /// decodes 1 MiB in about 2 ms alone, less fast with 15 others reading and decoding.
    fn default() -> Self {
        Self {
            device_call_s: 0.8e-3,
            device_frame_rate: 62.0 * MIB,
            small_frames_on_device: false,
            device_rate: 80.0 * GIB,
            host_thread_rate: 0.4 * GIB,
        }
    }
}

impl DecodeRates {
    /// With `rate` bytes a second for one host thread.
    #[must_use]
    pub fn with_host_thread_rate(mut self, rate: f64) -> Self {
        self.host_thread_rate = rate;
        self
    }

    /// The key a device learns these rates under: codecs of one name whose rates differ
    /// (Blosc's compressors) learn apart.
    pub(crate) fn key(&self) -> [u64; 5] {
        let [call, frame, rate, host] =
            [self.device_call_s, self.device_frame_rate, self.device_rate, self.host_thread_rate].map(f64::to_bits);
        [call, frame, rate, host, u64::from(self.small_frames_on_device)]
    }

    /// With nvCOMP's fixed cost per call (`call_s`), one frame's rate and the rate over a
    /// batch's frames (bytes a second).
    #[must_use]
    pub fn with_device_rates(mut self, call_s: f64, frame_rate: f64, rate: f64) -> Self {
        (self.device_call_s, self.device_frame_rate, self.device_rate) = (call_s, frame_rate, rate);
        self
    }

    /// With the device's three rates `factor` times slower (a factor this device's decodes have
    /// shown: [`DeviceSlowness`]).
    #[must_use]
    pub(crate) fn device_slower(mut self, factor: f64) -> Self {
        self.device_call_s *= factor;
        self.device_frame_rate /= factor;
        self.device_rate /= factor;
        self
    }

    /// Seconds the device takes for `m` frames of `mean` bytes, the largest `largest`.
    fn device(&self, m: usize, mean: f64, largest: f64) -> f64 {
        if m == 0 {
            return 0.0;
        }
        self.device_call_s + largest / self.device_frame_rate + m as f64 * mean / self.device_rate
    }

    /// Seconds `threads` host threads take for `k` frames of `mean` bytes, the largest `largest`.
    fn host(&self, k: usize, mean: f64, largest: f64, threads: usize) -> f64 {
        if k == 0 {
            return 0.0;
        }
        (k.div_ceil(threads.max(1)) as f64 * mean).max(largest) / self.host_thread_rate
    }

    /// Predicted seconds for `n` frames (`bytes` decoded in all, the largest `largest`) with `k`
    /// of them on `threads` host threads: the host's, the device's, and the device's for all `n`.
    #[must_use]
    pub fn predict(&self, n: usize, k: usize, bytes: u64, largest: u64, threads: usize) -> (f64, f64, f64) {
        let (mean, largest) = (bytes as f64 / n.max(1) as f64, largest as f64);
        let on_device = self.device(n - k.min(n), mean, largest);
        (self.host(k, mean, largest, threads), on_device, self.device(n, mean, largest))
    }

    /// Whether a batch whose largest frame decodes to `largest` bytes splits by these rates: not
    /// one of small frames where the device keeps them ([`DecodeRates::small_frames_on_device`]).
    pub(crate) fn splits(&self, largest: u64) -> bool {
        !(self.small_frames_on_device && largest < LARGE_CHUNK)
    }

    /// How many of `n` frames (`bytes` decoded in all, the largest `largest`) host threads
    /// decode beside the device so that both finish soonest: the smallest such share (ties keep
    /// frames on the device). The frames the host takes are any `k` of them. Small frames where
    /// the device keeps them ([`DecodeRates::small_frames_on_device`]): none, unless host
    /// threads decode them all within the device's fixed cost (frames of a few dozen KiB).
    #[must_use]
    pub fn host_share(&self, n: usize, bytes: u64, largest: u64, threads: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let (mean, largest) = (bytes as f64 / n as f64, largest as f64);
        if !self.splits(largest as u64) {
            return if self.host(n, mean, largest, threads) <= self.device_call_s { n } else { 0 };
        }
        let time = |k: usize| self.device(n - k, mean, largest).max(self.host(k, mean, largest, threads));
        (0..=n).min_by(|&a, &b| time(a).total_cmp(&time(b)).then(a.cmp(&b))).unwrap_or(0)
    }
}

/// What this device's reads have shown of one codec: a host thread's rate and nvCOMP's
/// slowness against the codec's rates. Each codec learns its own: a host thread decodes Blosc's
/// LZ4 several times faster than zstd, and nvCOMP's deflate runs at other rates than its zstd.
#[derive(Debug)]
pub(crate) struct Learned {
    pub(crate) host: HostRate,
    pub(crate) slowness: DeviceSlowness,
}

impl Learned {
    /// Starting from `rates` (the codec's).
    pub(crate) fn new(rates: &DecodeRates) -> Self {
        Self { host: HostRate::new(rates.host_thread_rate), slowness: DeviceSlowness::default() }
    }
}

/// One host thread's decode rate as observed on this device's reads (bytes a second), starting
/// from the codec's; each batch's host decodes move it a fifth of the way to what they showed.
#[derive(Debug)]
pub(crate) struct HostRate(AtomicU64);

impl HostRate {
    pub(crate) fn new(rate: f64) -> Self {
        Self(AtomicU64::new(rate.to_bits()))
    }

    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// A batch's host decodes: `bytes` decoded in `busy_s` seconds of thread time.
    pub(crate) fn observe(&self, bytes: u64, busy_s: f64) {
        if bytes < (1 << 20) || busy_s <= 0.0 {
            return; // too little to say anything
        }
        let seen = bytes as f64 / busy_s;
        // A lost race between two reads loses one of their observations: harmless.
        let next = 0.8 * self.get() + 0.2 * seen;
        self.0.store(next.to_bits(), Ordering::Relaxed);
    }
}

/// How much longer than its [`DecodeRates`] predicted nvCOMP has taken on this device's reads (a
/// factor, 1 at first). Frames of another content decode at other rates: 8 MiB zstd frames of
/// noisy int16, almost all Huffman-coded literals, decoded at least four times faster than the
/// rates (from float32 frames, whose sequences execute serially) predict. Each
/// batch timed on the device moves the factor half way (in the logarithm) to what it showed,
/// within 1/4 to 16; the first is not counted (it may include loading nvCOMP's kernels). A read
/// with a batch that the factor alone sent wholly to host threads (the unscaled rates would have
/// split it) moves a factor above 1 an eighth of the way back to 1, once, at its end, so that a
/// factor learned on one array does not keep the device idle for good; small reads, which go to
/// host threads at any factor, leave it.
#[derive(Debug)]
pub(crate) struct DeviceSlowness {
    factor: AtomicU64,
    warmed: std::sync::atomic::AtomicBool,
}

impl Default for DeviceSlowness {
    fn default() -> Self {
        Self { factor: AtomicU64::new(1f64.to_bits()), warmed: std::sync::atomic::AtomicBool::new(false) }
    }
}

impl DeviceSlowness {
    /// Batches predicted to take less are not timed: the call's fixed cost would dominate.
    pub(crate) const MIN_PREDICTED_S: f64 = 4e-3;

    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.factor.load(Ordering::Relaxed))
    }

    fn set(&self, factor: f64) {
        // A lost race between two reads loses one of their updates: harmless.
        self.factor.store(factor.clamp(0.25, 16.0).to_bits(), Ordering::Relaxed);
    }

    /// A batch's decode on the device: `predicted_s` by the rates (unscaled), `seen_s` timed.
    pub(crate) fn observe(&self, predicted_s: f64, seen_s: f64) {
        if predicted_s < Self::MIN_PREDICTED_S || !seen_s.is_finite() || seen_s <= 0.0 {
            return;
        }
        if !self.warmed.swap(true, Ordering::Relaxed) {
            return;
        }
        self.set((0.5 * (self.get().ln() + (seen_s / predicted_s).ln())).exp());
    }

    /// Whether the learned factor is what sends a batch wholly to host threads: with `rates`
    /// (unscaled) the device would keep some of its `n` frames, with the factor none. Only then
    /// does the batch say anything against the factor (a small read goes to the host at any).
    pub(crate) fn sends_all_to_host(
        &self,
        rates: &DecodeRates,
        n: usize,
        bytes: u64,
        largest: u64,
        threads: usize,
    ) -> bool {
        let factor = self.get();
        factor > 1.0
            && rates.device_slower(factor).host_share(n, bytes, largest, threads) == n
            && rates.host_share(n, bytes, largest, threads) < n
    }

    /// A read none of whose batches nvCOMP decoded because of the factor ([`Self::sends_all_to_host`]):
    /// once per read, at its end, as its timings are.
    pub(crate) fn relax(&self) {
        let factor = self.get();
        if factor > 1.0 {
            self.set((0.875 * factor.ln()).exp());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// Small batches go to host threads whatever the factor: they say nothing against it. A
    /// batch the unscaled rates would split, sent wholly to the host by the factor, does.
    #[test]
    fn only_batches_the_factor_sends_to_the_host_relax_it() {
        let rates = DecodeRates::default();
        let slowness = DeviceSlowness::default();
        assert!(!slowness.sends_all_to_host(&rates, 4096, 4096 * M, M, 16), "a factor of 1");
        slowness.set(16.0);
        assert!(!slowness.sends_all_to_host(&rates, 50, 50 * M, M, 16), "a tile goes to the host anyway");
        assert!(!slowness.sends_all_to_host(&rates, 1, M, M, 16));
        assert_eq!(rates.device_slower(16.0).host_share(1024, 1024 * M, M, 16), 1024);
        assert!(rates.host_share(1024, 1024 * M, M, 16) < 1024);
        assert!(slowness.sends_all_to_host(&rates, 1024, 1024 * M, M, 16));
        // Twenty small reads leave the factor where it was.
        for _ in 0..20 {
            if slowness.sends_all_to_host(&rates, 50, 50 * M, M, 16) {
                slowness.relax();
            }
        }
        assert!((slowness.get() - 16.0).abs() < 1e-9, "{}", slowness.get());
    }

    #[test]
    fn a_few_frames_go_to_host_threads_thousands_to_the_device() {
        let rates = DecodeRates::default();
        // One 1 MiB frame: 17 ms on the device, 2.5 on a host thread.
        assert_eq!(rates.host_share(1, M, M, 16), 1);
        // A tile's 50 frames: about 4 rounds of 16 threads, well under the device's latency.
        assert_eq!(rates.host_share(50, 50 * M, M, 16), 50);
        // 4096 frames of 1 MiB: the device takes most; the host some, both about 60 ms.
        let k = rates.host_share(4096, 4096 * M, M, 16);
        assert!(k > 0 && k < 1024, "{k}");
        let (device, host) = (rates.device(4096 - k, M as f64, M as f64), rates.host(k, M as f64, M as f64, 16));
        assert!((device - host).abs() < 0.01, "device {device} s, host {host} s");
        // With one host thread, the host takes far less.
        assert!(rates.host_share(4096, 4096 * M, M, 1) < k / 8);
        assert_eq!(rates.host_share(0, 0, 0, 16), 0);
    }

    #[test]
    fn small_frames_stay_on_a_device_that_keeps_them_large_ones_split() {
        // Our zstd decoder's rates: small frames stay on the device (but a few that host threads
        // finish within its fixed cost); large ones split by the rates.
        let rates = DecodeRates {
            device_call_s: 0.4e-3,
            device_frame_rate: 330.0 * MIB,
            device_rate: 63.0 * GIB,
            host_thread_rate: 0.4 * GIB,
            small_frames_on_device: true,
        };
        for n in [1, 16, 288, 1024, 4096] {
            assert_eq!(rates.host_share(n, n as u64 * M, M, 16), 0, "{n}");
        }
        // A device learned 16 times slower (from large frames): its fixed cost 6.4 ms, which
        // host threads beat on a few frames only.
        assert_eq!(rates.device_slower(16.0).host_share(1024, 1024 * M, M, 16), 0);
        assert_eq!(rates.device_slower(16.0).host_share(1, M, M, 16), 1);
        assert_eq!(rates.host_share(64, 64 * (LARGE_CHUNK - 1), LARGE_CHUNK - 1, 16), 0);
        assert!(!rates.splits(M) && rates.splits(LARGE_CHUNK));
        // Frames of a few dozen KiB: host threads finish within the device's fixed cost.
        let kib = 1 << 10;
        assert_eq!(rates.host_share(4, 4 * 64 * kib, 64 * kib, 16), 4);
        assert_eq!(rates.host_share(64, 64 * 64 * kib, 64 * kib, 16), 0);
        // A handful of 16 MiB frames: each executes for about 50 ms on the device, 40 on a host
        // thread; 64 of them: the host takes a share.
        assert_eq!(rates.host_share(6, 6 * 16 * M, 16 * M, 16), 6);
        let k = rates.host_share(64, 64 * 16 * M, 16 * M, 16);
        assert!(k > 0 && k < 64, "{k}");
        // Without the flag, the same rates split small frames too.
        let split = DecodeRates { small_frames_on_device: false, ..rates };
        assert_eq!(split.host_share(16, 16 * M, M, 16), 16);
        assert_ne!(split.key(), rates.key(), "learned apart");
    }

    #[test]
    fn large_frames_split_small_ones_stay_on_the_device_when_many() {
        let rates = DecodeRates::default();
        // A handful of 16 MiB frames: all on host threads (40 ms each there, 260 on the device).
        assert_eq!(rates.host_share(6, 6 * 16 * M, 16 * M, 16), 6);
        // 512 of them: a share each way.
        let k = rates.host_share(512, 512 * 16 * M, 16 * M, 16);
        assert!(k > 16 && k < 256, "{k}");
        // 4096 frames of 16 KiB: two milliseconds on the device, which keeps most of them.
        assert!(rates.host_share(4096, 4096 * (16 << 10), 16 << 10, 16) < 1024);
    }

    #[test]
    fn a_slow_device_learned_moves_large_noisy_frames_to_the_host() {
        let rates = DecodeRates::default();
        // 128 frames of 8 MiB: the defaults give the device about half.
        let (n, size) = (128, 8 * M);
        let k = rates.host_share(n, n as u64 * size, size, 16);
        assert!(k > 16 && k < 112, "{k}");
        // The device took four times as long as predicted, twice: the factor nears 4 and the
        // host takes (nearly) all.
        let slow = DeviceSlowness::default();
        let predicted = rates.predict(n, k, n as u64 * size, size, 16).1;
        slow.observe(predicted, 100.0 * predicted); // the first: not counted
        assert_eq!(slow.get().to_bits(), 1f64.to_bits());
        slow.observe(predicted, 4.0 * predicted);
        slow.observe(predicted, 4.0 * predicted);
        assert!((slow.get() - 4f64.powf(0.75)).abs() < 1e-9, "{}", slow.get());
        let slower = rates.device_slower(slow.get());
        assert!(slower.host_share(n, n as u64 * size, size, 16) > k + 16);
        // Four times faster (literal-heavy frames): the device takes more.
        assert!(rates.device_slower(0.25).host_share(n, n as u64 * size, size, 16) < k / 2);
        // Too short to time, or nonsense: no change; bounded either way.
        let now = slow.get();
        slow.observe(1e-3, 1.0);
        slow.observe(1.0, f64::NAN);
        slow.observe(1.0, 0.0);
        assert_eq!(slow.get().to_bits(), now.to_bits());
        // Unobserved batches relax it towards 1, never past it.
        slow.relax();
        assert!((slow.get() - now.powf(0.875)).abs() < 1e-9);
        for _ in 0..200 {
            slow.relax();
        }
        assert!(slow.get() >= 1.0 && slow.get() < 1.001, "{}", slow.get());
        for _ in 0..20 {
            slow.observe(1.0, 1e6);
        }
        assert_eq!(slow.get().to_bits(), 16f64.to_bits());
        for _ in 0..20 {
            slow.observe(1.0, 1e-6);
        }
        assert_eq!(slow.get().to_bits(), 0.25f64.to_bits());
        slow.relax(); // below 1: only a timed batch moves it
        assert_eq!(slow.get().to_bits(), 0.25f64.to_bits());
    }

    #[test]
    fn the_host_rate_moves_towards_what_is_observed() {
        let rate = HostRate::new(DecodeRates::default().host_thread_rate);
        let start = rate.get();
        rate.observe(64 * M, 2.0 * 64.0 * M as f64 / start); // half the rate
        assert!(rate.get() < start && rate.get() > start / 2.0);
        let now = rate.get();
        rate.observe(1000, 1e-9); // too few bytes to count
        rate.observe(64 * M, 0.0);
        assert_eq!(rate.get().to_bits(), now.to_bits());
    }
}

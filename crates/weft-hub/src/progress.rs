//! Progress reporting for long steps (downloads, extraction, hashing).

/// Receives progress of long-running steps.
///
/// A step starts with [`begin`](Progress::begin), reports bytes with
/// [`advance`](Progress::advance) and ends with [`finish`](Progress::finish).
/// Steps never nest. The CLI implements this with a progress bar; library users
/// who do not care pass [`NoProgress`].
pub trait Progress {
    /// A new step starts; `total_bytes` is its size when known.
    fn begin(&mut self, label: &str, total_bytes: Option<u64>);
    /// `bytes` more bytes of the current step are done.
    fn advance(&mut self, bytes: u64);
    /// The current step is over (successfully or not).
    fn finish(&mut self);
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&mut self, _label: &str, _total_bytes: Option<u64>) {}
    fn advance(&mut self, _bytes: u64) {}
    fn finish(&mut self) {}
}

/// Calls [`Progress::finish`] when dropped, so a step is closed on every path.
pub(crate) struct Step<'a> {
    progress: &'a mut dyn Progress,
}

impl<'a> Step<'a> {
    /// Begins a step that ends when the returned guard is dropped.
    pub(crate) fn begin(
        progress: &'a mut dyn Progress,
        label: &str,
        total_bytes: Option<u64>,
    ) -> Self {
        progress.begin(label, total_bytes);
        Step { progress }
    }

    /// Reports `bytes` more bytes done.
    pub(crate) fn advance(&mut self, bytes: u64) {
        self.progress.advance(bytes);
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        self.progress.finish();
    }
}

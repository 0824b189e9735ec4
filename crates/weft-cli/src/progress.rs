//! A terminal progress bar for model downloads.

use indicatif::{ProgressBar, ProgressStyle};

/// Shows the hub's progress as an indicatif bar on stderr (hidden when stderr is not a terminal).
#[derive(Default)]
pub struct Bar {
    bar: Option<ProgressBar>,
}

impl weft::Progress for Bar {
    fn begin(&mut self, label: &str, total_bytes: Option<u64>) {
        let bar = match total_bytes {
            Some(n) => ProgressBar::new(n).with_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner(),
        };
        bar.set_message(label.to_string());
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

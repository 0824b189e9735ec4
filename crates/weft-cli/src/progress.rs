//! A terminal progress bar for model downloads.

use indicatif::{ProgressBar, ProgressStyle};

/// Shows the hub's progress as an indicatif bar on stderr; when stderr is not a terminal (a
/// script's log, a service's journal), as one line per step instead, so that a download of
/// minutes does not pass in silence.
#[derive(Default)]
pub struct Bar {
    bar: Option<ProgressBar>,
}

impl weft::Progress for Bar {
    fn begin(&mut self, label: &str, total_bytes: Option<u64>) {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            match total_bytes {
                Some(n) => errln!("weft: {label} ({:.1} MB)", n as f64 / 1e6),
                None => errln!("weft: {label}"),
            }
        }
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

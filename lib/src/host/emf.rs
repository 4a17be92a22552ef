//! The relay's metrics as CloudWatch Embedded Metric Format documents on stdout (where
//! CloudWatch Logs, the CloudWatch agent or Fluent Bit turn them into metrics), flushed
//! every interval while a relay runs and once at its end.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::metrics::emf::EmfMetrics;

/// How often a running relay writes its metrics by default (and once more at its end): the
/// alarms evaluate one-minute periods, so a long run reports in every one of them.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(60);

/// Where the documents go: stdout, or a writer of the caller's.
#[derive(Clone, Default)]
struct Output(Option<Arc<Mutex<dyn Write + Send>>>);

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "writer" } else { "stdout" })
    }
}

/// EMF export of a relay host: the aggregate, its output and the flush period.
#[derive(Debug, Clone)]
pub struct EmfExport {
    metrics: Arc<EmfMetrics>,
    output: Output,
    interval: Duration,
}

impl EmfExport {
    /// Documents of `metrics` on stdout every [`DEFAULT_FLUSH_INTERVAL`].
    pub fn new(metrics: EmfMetrics) -> Self {
        EmfExport {
            metrics: Arc::new(metrics),
            output: Output::default(),
            interval: DEFAULT_FLUSH_INTERVAL,
        }
    }

    /// Flushes every `interval` instead (at least a millisecond).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Writes the documents to `out` instead of stdout (a test reading them back, a file).
    pub fn with_output(mut self, out: impl Write + Send + 'static) -> Self {
        self.output = Output(Some(Arc::new(Mutex::new(out))));
        self
    }

    /// The aggregate the relay records into.
    pub fn metrics(&self) -> &Arc<EmfMetrics> {
        &self.metrics
    }

    /// Writes what was gathered since the last flush; a failed write is logged.
    pub fn flush(&self) {
        let written = match &self.output.0 {
            None => self.metrics.flush_to(&mut std::io::stdout().lock()),
            Some(out) => {
                let mut guard = out.lock().unwrap_or_else(|e| e.into_inner());
                let mut writer: &mut dyn Write = &mut *guard;
                self.metrics.flush_to(&mut writer)
            }
        };
        if let Err(e) = written {
            warn!(error = %e, "writing metrics failed");
        }
    }

    /// Starts flushing every interval, until the returned guard is dropped; the guard's
    /// drop does not flush (the host flushes once more after the run).
    pub(crate) fn start(&self) -> Flusher {
        let export = self.clone();
        Flusher(tokio::spawn(async move {
            let mut ticks =
                tokio::time::interval_at(Instant::now() + export.interval, export.interval);
            loop {
                ticks.tick().await;
                export.flush();
            }
        }))
    }
}

/// The periodic flush of a run; aborted when dropped.
#[derive(Debug)]
pub(crate) struct Flusher(JoinHandle<()>);

impl Drop for Flusher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

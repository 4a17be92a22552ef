//! The shutdown side of a run: the signal, the grace it leaves, the hard deadline, "run
//! this step unless the hard deadline passes", and "sleep until then, a commit
//! notification, or the signal".

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

/// A shutdown signal: the run stops gracefully when it completes.
pub(super) type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The signal, the grace it leaves and the hard deadline of one run.
pub(super) struct Shutdown {
    signal: Option<Signal>,
    grace: Duration,
    hard_deadline: Option<Instant>,
    requested: bool,
}

impl Shutdown {
    /// A run that ends by `deadline` (if any) or `grace` after `signal` completes.
    pub(super) fn new(deadline: Option<Instant>, signal: Option<Signal>, grace: Duration) -> Self {
        Shutdown {
            signal,
            grace,
            hard_deadline: deadline,
            requested: false,
        }
    }

    /// When everything, the graceful stop included, must have ended.
    pub(super) fn hard_deadline(&self) -> Option<Instant> {
        self.hard_deadline
    }

    /// Whether the signal has fired.
    pub(super) fn requested(&self) -> bool {
        self.requested
    }

    fn fire(&mut self) {
        info!("shutdown signal: finishing in-flight work, then stopping");
        self.signal = None;
        self.requested = true;
        let stop_by = Instant::now() + self.grace;
        self.hard_deadline = Some(self.hard_deadline.map_or(stop_by, |d| d.min(stop_by)));
    }

    /// Runs `step` to its end, or until the hard deadline (`None`: still in flight then).
    /// The signal firing meanwhile brings the hard deadline forward to the grace, and the
    /// step goes on.
    pub(super) async fn race<T>(&mut self, step: impl Future<Output = T>) -> Option<T> {
        let mut step = std::pin::pin!(step);
        loop {
            let hard = self.hard_deadline;
            let bounded = async {
                match hard {
                    Some(d) => tokio::time::timeout_at(d, &mut step).await.ok(),
                    None => Some((&mut step).await),
                }
            };
            match self.signal.as_mut() {
                Some(sig) => {
                    tokio::select! {
                        r = bounded => return r,
                        _ = sig => self.fire(),
                    }
                }
                None => return bounded.await,
            }
        }
    }

    /// Sleeps until `until`, until `notified` completes, or until the signal fires.
    pub(super) async fn sleep_until(&mut self, until: Instant, notified: impl Future<Output = ()>) {
        match self.signal.as_mut() {
            Some(sig) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = notified => {}
                    _ = sig => self.fire(),
                }
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = notified => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    const S: Duration = Duration::from_secs(1);

    fn signalled() -> (oneshot::Sender<()>, Signal) {
        let (tx, rx) = oneshot::channel::<()>();
        (
            tx,
            Box::pin(async move {
                let _ = rx.await;
            }),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_ends_at_the_hard_deadline() {
        let start = Instant::now();
        let mut s = Shutdown::new(Some(start + 5 * S), None, S);
        assert_eq!(s.race(async { 7 }).await, Some(7));
        assert_eq!(s.race(tokio::time::sleep(10 * S)).await, None);
        assert_eq!(Instant::now(), start + 5 * S);
        assert!(!s.requested());
    }

    #[tokio::test(start_paused = true)]
    async fn the_signal_leaves_the_grace_to_a_step_in_flight() {
        let start = Instant::now();
        let (tx, signal) = signalled();
        let mut s = Shutdown::new(Some(start + 60 * S), Some(signal), 2 * S);
        tokio::spawn(async move {
            tokio::time::sleep(S).await;
            let _ = tx.send(());
        });
        // A step of 2.5 s: the signal at 1 s moves the hard deadline to 3 s, it finishes.
        assert_eq!(
            s.race(async {
                tokio::time::sleep(S * 5 / 2).await;
                "done"
            })
            .await,
            Some("done")
        );
        assert!(s.requested());
        assert_eq!(s.hard_deadline(), Some(start + 3 * S));
        // The next step is cut at the new hard deadline.
        assert_eq!(s.race(tokio::time::sleep(10 * S)).await, None);
        assert_eq!(Instant::now(), start + 3 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_ends_at_its_time_a_notification_or_the_signal() {
        let start = Instant::now();
        let (tx, signal) = signalled();
        let mut s = Shutdown::new(None, Some(signal), 4 * S);
        s.sleep_until(start + S, std::future::pending()).await;
        assert_eq!(Instant::now(), start + S);
        s.sleep_until(start + 60 * S, async {}).await;
        assert_eq!(Instant::now(), start + S, "a notification wakes it at once");
        let _ = tx.send(());
        s.sleep_until(start + 60 * S, std::future::pending()).await;
        assert!(s.requested());
        assert_eq!(s.hard_deadline(), Some(start + 5 * S));
    }
}

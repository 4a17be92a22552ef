//! Scenario 6: a proxy slot of the stack's broker (which advertises the slot's address) served
//! by a fault-injecting TCP proxy, so every
//! Kafka connection of the relays (bootstrap and produce) goes through the proxy, which
//! cuts connections, stalls them, or refuses new ones. Loopback only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the proxy does to connections now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward.
    Pass,
    /// Hold every byte (both directions) until the mode changes.
    Stall,
    /// Close new connections at once (open ones were cut when this mode began).
    Refuse,
}

/// Counters of the proxy.
#[derive(Debug, Default, Serialize)]
pub struct TcpStats {
    /// Connections accepted and forwarded.
    pub connections: AtomicU64,
    /// Times every open connection was cut.
    pub cuts: AtomicU64,
    /// Stalls.
    pub stalls: AtomicU64,
    /// Refusal windows.
    pub refusals: AtomicU64,
    /// Connections refused.
    pub refused_connections: AtomicU64,
}

/// The proxy; `cut`, `stall`, `refuse`, `pass` change what it does.
#[derive(Debug)]
pub struct TcpFaultProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: watch::Sender<(Mode, u64)>,
    /// Counters.
    pub stats: Arc<TcpStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TcpFaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpFaultProxy {
    /// Serves `listener`, forwarding to `upstream`.
    pub fn start(listener: TcpListener, upstream: SocketAddr) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel((Mode::Pass, 0u64));
        let stats = Arc::new(TcpStats::default());
        let st = stats.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                if rx.borrow().0 == Mode::Refuse {
                    st.refused_connections.fetch_add(1, Ordering::Relaxed);
                    drop(client);
                    continue;
                }
                st.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    if let Ok(up) = TcpStream::connect(upstream).await {
                        let _ = splice(client, up, rx).await;
                    }
                });
            }
        });
        Ok(TcpFaultProxy {
            addr,
            mode: tx,
            stats,
            task,
        })
    }

    /// Cuts every open connection.
    pub fn cut(&self) {
        self.stats.cuts.fetch_add(1, Ordering::Relaxed);
        self.mode.send_modify(|(_, generation)| *generation += 1);
    }

    /// Holds every byte of every connection until [`TcpFaultProxy::pass`].
    pub fn stall(&self) {
        self.stats.stalls.fetch_add(1, Ordering::Relaxed);
        self.mode.send_modify(|(m, _)| *m = Mode::Stall);
    }

    /// Cuts every connection and refuses new ones until [`TcpFaultProxy::pass`].
    pub fn refuse(&self) {
        self.stats.refusals.fetch_add(1, Ordering::Relaxed);
        self.mode.send_modify(|(m, generation)| {
            *m = Mode::Refuse;
            *generation += 1;
        });
    }

    /// Forwards again.
    pub fn pass(&self) {
        self.mode.send_modify(|(m, _)| *m = Mode::Pass);
    }
}

/// Copies both ways until either side closes or the connection is cut.
async fn splice(
    client: TcpStream,
    upstream: TcpStream,
    rx: watch::Receiver<(Mode, u64)>,
) -> std::io::Result<()> {
    let generation = rx.borrow().1;
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let a = pump(cr, uw, rx.clone(), generation);
    let b = pump(ur, cw, rx, generation);
    tokio::select! {
        r = a => r,
        r = b => r,
    }
}

async fn pump<R, W>(
    mut from: R,
    mut to: W,
    mut rx: watch::Receiver<(Mode, u64)>,
    generation: u64,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => r?,
            _ = rx.changed() => {
                if rx.borrow().1 != generation {
                    return Ok(());
                }
                continue;
            }
        };
        if n == 0 {
            return Ok(());
        }
        // Held while stalled; cut if the generation moves meanwhile.
        loop {
            let (mode, g) = *rx.borrow();
            if g != generation {
                return Ok(());
            }
            if mode != Mode::Stall {
                break;
            }
            if rx.changed().await.is_err() {
                return Ok(());
            }
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// The stack's broker seen through a [`TcpFaultProxy`] that holds one of its proxy slots
/// ([`outbox_testkit::kafka::ProxySlot`]): the broker advertises the proxy's address there,
/// so a client bootstrapped from it never reaches the broker but through the proxy.
#[derive(Debug)]
pub struct ProxiedBroker {
    /// The proxy (the address to bootstrap from).
    pub proxy: TcpFaultProxy,
}

impl ProxiedBroker {
    /// Takes a proxy slot of the stack's broker and serves it with the proxy; waits until
    /// the broker answers through the proxy.
    pub async fn start() -> Result<Self, String> {
        let slot = tokio::task::spawn_blocking(outbox_testkit::kafka::ProxySlot::acquire)
            .await
            .map_err(|e| format!("taking a Kafka proxy slot: {e}"))??;
        let upstream = slot.upstream;
        slot.listener
            .set_nonblocking(true)
            .map_err(|e| format!("the proxy slot's listener: {e}"))?;
        let listener = TcpListener::from_std(slot.listener)
            .map_err(|e| format!("the proxy slot's listener: {e}"))?;
        let proxy = TcpFaultProxy::start(listener, upstream)
            .map_err(|e| format!("starting the Kafka proxy: {e}"))?;
        let broker = ProxiedBroker { proxy };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if crate::kafka_py(&["--bootstrap", &broker.bootstrap(), "ping", "--timeout", "2"])
                .is_ok()
            {
                return Ok(broker);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the broker's proxy slot {upstream} did not answer through the proxy in 30 s"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `host:port` to bootstrap from (the proxy).
    pub fn bootstrap(&self) -> String {
        self.proxy.addr.to_string()
    }
}

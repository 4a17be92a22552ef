//! The stack's Apache Kafka as tests reach it: a proxy slot of the shared broker
//! ([`ProxySlot`]), a broker of a test's own for its lifecycle ([`PrivateKafka`]: kill
//! and restart), the secured listeners' settings ([`SecureListeners`]) and ACL grants
//! ([`grant_topic`]). `scripts/stack.sh` says what the broker is and how it is set up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::{stack_var, try_stack_py, try_stack_var};

/// A proxy slot of the stack's broker: the broker has a PLAINTEXT listener on
/// [`ProxySlot::upstream`] that advertises [`ProxySlot::listener`]'s address, so a client
/// that bootstraps from the listener's address finds every broker address in metadata
/// pointing back at it, and all its connections pass the proxy that serves the listener.
///
/// A slot is owned by whoever holds its advertised port bound: dropping the listener
/// frees it. `scripts/stack.sh` makes eight (`OUTBOX_KAFKA_PROXY_SLOTS`).
#[derive(Debug)]
pub struct ProxySlot {
    /// Bound on the slot's advertised port; the proxy accepts on it.
    pub listener: std::net::TcpListener,
    /// The broker's listener of this slot: where the proxy forwards to.
    pub upstream: SocketAddr,
}

impl ProxySlot {
    /// Takes a free slot, waiting up to two minutes while every slot is held.
    pub fn acquire() -> Result<Self, String> {
        let slots = parse_slots(&try_stack_var("OUTBOX_KAFKA_PROXY_SLOTS")?)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            for (upstream, advertised) in &slots {
                if let Ok(listener) = std::net::TcpListener::bind(advertised) {
                    return Ok(ProxySlot {
                        listener,
                        upstream: *upstream,
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "every Kafka proxy slot of the stack ({} of them) stayed bound for 120 s",
                    slots.len()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The advertised address (`127.0.0.1:PORT`): what clients bootstrap from.
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }
}

/// `UPSTREAM:ADVERTISED ...` (ports on 127.0.0.1) as `scripts/stack.sh` exports them.
fn parse_slots(text: &str) -> Result<Vec<(SocketAddr, SocketAddr)>, String> {
    let port = |s: &str| -> Result<SocketAddr, String> {
        let p: u16 = s
            .parse()
            .map_err(|_| format!("OUTBOX_KAFKA_PROXY_SLOTS: {s:?} is not a port"))?;
        Ok(([127, 0, 0, 1], p).into())
    };
    let slots = text
        .split_whitespace()
        .map(|pair| {
            let (up, adv) = pair.split_once(':').ok_or_else(|| {
                format!("OUTBOX_KAFKA_PROXY_SLOTS: {pair:?} is not UPSTREAM:ADVERTISED")
            })?;
            Ok((port(up)?, port(adv)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if slots.is_empty() {
        return Err("OUTBOX_KAFKA_PROXY_SLOTS is empty".into());
    }
    Ok(slots)
}

/// A broker of a test's own (the stack's Kafka version, PLAINTEXT only, no authorizer),
/// for a test that needs a broker's lifecycle: [`PrivateKafka::kill`] sends SIGKILL,
/// [`PrivateKafka::restart`] starts it again on the same ports with the same data.
/// Killed and its directory removed when dropped.
#[derive(Debug)]
pub struct PrivateKafka {
    dir: PathBuf,
    plaintext: u16,
    controller: u16,
    child: Option<std::process::Child>,
}

impl PrivateKafka {
    /// Starts the broker and waits (up to 90 s) until it answers.
    ///
    /// Its ports lie below the kernel's ephemeral range, so that while it is down no
    /// outgoing connection (a client reconnecting to it, say) takes one of them, and
    /// [`PrivateKafka::restart`] finds them free.
    pub fn start() -> Result<Self, String> {
        let (plaintext, controller) = ports_below_the_ephemeral_range()?;
        let dir = std::env::temp_dir().join(crate::random_name("private-kafka"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut broker = PrivateKafka {
            dir,
            plaintext,
            controller,
            child: None,
        };
        broker.restart()?;
        Ok(broker)
    }

    /// `127.0.0.1:PORT` of its listener.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.plaintext)
    }

    /// The broker's log (its standard output and error, across restarts).
    pub fn log(&self) -> PathBuf {
        self.dir.join("broker.log")
    }

    /// SIGKILL, and waits for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker (again) on its ports and data, and waits until it answers.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let python = stack_var("OUTBOX_STACK_PYTHON");
        let scripts = stack_var("OUTBOX_STACK_SCRIPTS");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .map_err(|e| format!("opening {}: {e}", self.log().display()))?;
        let child = std::process::Command::new(&python)
            .arg(format!("{scripts}/kafka_broker.py"))
            .args(["run", "--dir"])
            .arg(self.dir.join("broker"))
            .args(["--plaintext", &self.plaintext.to_string()])
            .args(["--controller", &self.controller.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| format!("the broker's log: {e}"))?,
            )
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting kafka_broker.py: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if try_stack_py(
                "kafka.py",
                &["--bootstrap", &self.bootstrap(), "ping", "--timeout", "2"],
            )
            .is_ok()
            {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "the private broker exited with {status} (log {})",
                    self.log().display()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the private broker did not answer in 90 s (log {})",
                    self.log().display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Two distinct ports that bind now, below the first port of
/// `/proc/sys/net/ipv4/ip_local_port_range` (the range outgoing connections take theirs
/// from); tried in a pseudo-random order so that tests running at once rarely meet.
fn ports_below_the_ephemeral_range() -> Result<(u16, u16), String> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .map_err(|e| format!("reading ip_local_port_range: {e}"))?;
    let low: u32 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("ip_local_port_range: {range:?}"))?;
    let first = low.saturating_sub(12_000).max(1024);
    let span = low.saturating_sub(first).max(1);
    let seed = uuid::Uuid::new_v4().as_u128();
    let mut taken = Vec::new();
    for i in 0..span {
        let port = first + ((seed as u32).wrapping_add(i.wrapping_mul(7919)) % span);
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        // Held until both are known, so that they differ (a port held fails to bind).
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            taken.push((port, listener));
            if taken.len() == 2 {
                return Ok((taken[0].0, taken[1].0));
            }
        }
    }
    Err(format!("no two free ports in {first}..{low}"))
}

impl Drop for PrivateKafka {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The stack broker's secured listeners and what a client needs for them (`Debug` shows
/// no password).
#[derive(Clone)]
pub struct SecureListeners {
    /// SASL_SSL (`host:port`): SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN.
    pub sasl_ssl: String,
    /// SSL with client certificates required (`host:port`).
    pub ssl: String,
    /// The stack's CA (PEM file) that signed the broker's and the clients' certificates.
    pub ca_file: PathBuf,
    /// The principal that may write every topic.
    pub user: String,
    /// Its password (SCRAM and PLAIN).
    pub password: String,
    /// A principal with no grant.
    pub nogrant_user: String,
    /// Its password.
    pub nogrant_password: String,
    dir: PathBuf,
}

impl std::fmt::Debug for SecureListeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureListeners")
            .field("sasl_ssl", &self.sasl_ssl)
            .field("ssl", &self.ssl)
            .field("ca_file", &self.ca_file)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("nogrant_user", &self.nogrant_user)
            .field("nogrant_password", &"<redacted>")
            .finish()
    }
}

impl SecureListeners {
    /// From the stack's variables (panics outside the stack).
    pub fn from_stack() -> Self {
        let dir = PathBuf::from(stack_var("OUTBOX_KAFKA_TLS_DIR"));
        SecureListeners {
            sasl_ssl: stack_var("OUTBOX_KAFKA_SASL_SSL"),
            ssl: stack_var("OUTBOX_KAFKA_SSL"),
            ca_file: dir.join("ca.pem"),
            user: stack_var("OUTBOX_KAFKA_USER"),
            password: stack_var("OUTBOX_KAFKA_PASSWORD"),
            nogrant_user: stack_var("OUTBOX_KAFKA_NOGRANT_USER"),
            nogrant_password: stack_var("OUTBOX_KAFKA_NOGRANT_PASSWORD"),
            dir,
        }
    }

    /// The client certificate (PEM) of `user` (`outbox` or `nogrant`; its CN is the
    /// principal).
    pub fn cert_file(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.crt"))
    }

    /// That certificate's private key (PKCS#8 PEM).
    pub fn key_file(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.key"))
    }
}

/// Allows `principal` (`User:NAME`) to write and describe `topic`, through the admin
/// listener.
pub fn grant_topic(principal: &str, topic: &str) -> Result<(), String> {
    try_stack_py(
        "kafka_broker.py",
        &[
            "grant",
            "--bootstrap",
            &stack_var("KAFKA_BOOTSTRAP_SERVERS"),
            "--principal",
            principal,
            "--topic",
            topic,
        ],
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_parse_and_bad_ones_are_named() {
        let slots = parse_slots("30001:20001 30002:20002").unwrap();
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[1].0.port(), 30002);
        assert_eq!(slots[1].1.port(), 20002);
        assert!(parse_slots("").unwrap_err().contains("empty"));
        assert!(parse_slots("30001")
            .unwrap_err()
            .contains("UPSTREAM:ADVERTISED"));
        assert!(parse_slots("x:1").unwrap_err().contains("not a port"));
    }
}

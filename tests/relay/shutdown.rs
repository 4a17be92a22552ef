//! Graceful stops among peers: a peer that reads between the stop stamp and the
//! releases keeps watching, and releases landing in any order refuse no claim among four
//! relays (a proxy in front of DynamoDB Local holds each release).

use std::sync::Mutex;

use dynamo_outbox::accounting::RequestCounter;

use super::*;

/// The relay id of a graceful stop's release (an `UpdateItem` that removes the owner
/// guarded by the owner alone; a round's releases also carry the expiry read), from a
/// request body.
fn stop_release_of(body: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let values = &json["ExpressionAttributeValues"];
    (json["UpdateExpression"] == "REMOVE #owner" && values.get(":read").is_none())
        .then(|| values[":me"]["S"].as_str().map(String::from))
        .flatten()
}

/// Reads one HTTP/1.1 message (head and body, by Content-Length or chunked), raw, and
/// the offset of its body.
fn read_message(r: &mut impl std::io::BufRead) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let (mut raw, mut length, mut chunked) = (Vec::new(), 0usize, false);
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        raw.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        let text = text.trim_end();
        if text.is_empty() {
            break;
        }
        if let Some(v) = text.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = text.strip_prefix("transfer-encoding:") {
            chunked = v.contains("chunked");
        }
    }
    let body_at = raw.len();
    if chunked {
        loop {
            let mut size_line = Vec::new();
            r.read_until(b'\n', &mut size_line)?;
            raw.extend_from_slice(&size_line);
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&size_line)
                    .trim()
                    .split(';')
                    .next()
                    .unwrap_or("0"),
                16,
            )
            .unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk)?;
            raw.extend_from_slice(&chunk);
            if size == 0 {
                break;
            }
        }
    } else {
        let mut body = vec![0; length];
        r.read_exact(&mut body)?;
        raw.extend_from_slice(&body);
    }
    Ok(Some((raw, body_at)))
}

/// How long the proxy holds the `k`-th stop release (from 0) of a relay.
type HoldPolicy = dyn Fn(&str, usize) -> Duration + Send + Sync;

/// A forwarding HTTP/1.1 proxy in front of DynamoDB Local (loopback, a thread per
/// connection) that holds every release of a graceful stop for the time `hold` gives
/// it before forwarding it, and forwards everything else at once. A stop sends its
/// releases concurrently, each on a connection of its own, so held releases land in
/// the order their holds make, and nothing else waits for them.
struct HoldingProxy {
    url: String,
    /// Stop releases held so far, by relay id.
    held: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl HoldingProxy {
    fn start(hold: Arc<HoldPolicy>) -> Self {
        let upstream = stack_var("AWS_ENDPOINT_URL_DYNAMODB")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let counts = held.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, hold, counts) = (upstream.clone(), hold.clone(), counts.clone());
                std::thread::spawn(move || {
                    let _ = Self::serve(client, &upstream, &*hold, &counts);
                });
            }
        });
        HoldingProxy { url, held }
    }

    fn serve(
        client: std::net::TcpStream,
        upstream: &str,
        hold: &HoldPolicy,
        counts: &Mutex<BTreeMap<String, usize>>,
    ) -> std::io::Result<()> {
        use std::io::Write;
        client.set_nodelay(true)?;
        let mut from_client = std::io::BufReader::new(client.try_clone()?);
        let mut to_client = client;
        let up = std::net::TcpStream::connect(upstream)?;
        up.set_nodelay(true)?;
        let mut from_up = std::io::BufReader::new(up.try_clone()?);
        let mut to_up = up;
        while let Some((request, body_at)) = read_message(&mut from_client)? {
            if let Some(relay) = stop_release_of(&request[body_at..]) {
                let k = {
                    let mut counts = counts.lock().unwrap();
                    let k = counts.entry(relay.clone()).or_default();
                    *k += 1;
                    *k - 1
                };
                std::thread::sleep(hold(&relay, k));
            }
            to_up.write_all(&request)?;
            let Some((response, _)) = read_message(&mut from_up)? else {
                return Ok(());
            };
            to_client.write_all(&response)?;
        }
        Ok(())
    }

    /// Stop releases of `relay` seen so far.
    fn of(&self, relay: &str) -> usize {
        self.held.lock().unwrap().get(relay).copied().unwrap_or(0)
    }

    /// A client through the proxy, with the wire counter.
    async fn client(&self, counter: &RequestCounter) -> aws_sdk_dynamodb::Client {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&config)
                .endpoint_url(&self.url)
                .interceptor(counter.clone())
                .build(),
        )
    }
}

/// A pseudo-random number below `bound` (a fresh UUID's bits).
fn random_below(bound: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(bound.max(1))) as u64
}

/// Samples lease ownership every 50 ms until `done`; every stretch in which a bucket
/// that had been owned was unowned, as (start, length), stretches still open at the
/// end included.
fn sample_unowned(
    client: aws_sdk_dynamodb::Client,
    options: OutboxOptions,
    done: Arc<AtomicBool>,
) -> JoinHandle<Vec<(Instant, Duration)>> {
    tokio::spawn(async move {
        let n = options.bucket_count as usize;
        let mut owned_once = vec![false; n];
        let mut since: Vec<Option<Instant>> = vec![None; n];
        let mut stretches = Vec::new();
        while !done.load(Ordering::SeqCst) {
            let owners = lease_owners(&client, &options).await;
            let now = Instant::now();
            for (b, owner) in owners.iter().enumerate() {
                match (owner, since[b]) {
                    (Some(_), Some(s)) => {
                        stretches.push((s, now - s));
                        since[b] = None;
                    }
                    (Some(_), None) => owned_once[b] = true,
                    (None, None) if owned_once[b] => since[b] = Some(now),
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let now = Instant::now();
        stretches.extend(since.into_iter().flatten().map(|s| (s, now - s)));
        stretches
    })
}

/// A peer that reads after the leaver stamped its stop but before its releases
/// landed keeps watching, and takes the buckets within a few handover steps of the
/// releases, not at its next regular round (a renew interval later). Two consecutive
/// runs with deadlines (renew interval 5 s); the leaver's releases are held 1.5 s, so
/// the successor's re-read after the announced stop finds the stamp and every lease
/// still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_reads_between_the_stamp_and_the_releases_keeps_watching() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let publisher = kafka_publisher().await;
    let wire = RequestCounter::default();
    let hold_for = Duration::from_millis(1500);
    let proxy = HoldingProxy::start(Arc::new(move |relay: &str, _| {
        if relay == "leaver" {
            hold_for
        } else {
            Duration::ZERO
        }
    }));
    let through = proxy.client(&wire).await;
    let timings = |id: &str| {
        let mut o = fast_relay_options(id, 4);
        o.lease_renew_interval = Duration::from_secs(5);
        o.lease_duration = Duration::from_secs(15);
        o
    };
    let renew = timings("x").lease_renew_interval;
    let t0 = Instant::now();
    let first = relay_with(&through, &options, publisher.clone(), timings("leaver")).await;
    let first = tokio::spawn(async move { first.run_until(t0 + Duration::from_secs(7)).await });
    wait_until(
        "the leaver owns every bucket",
        Duration::from_secs(5),
        || async {
            lease_owners(&client, &options)
                .await
                .iter()
                .all(|o| o.as_deref() == Some("leaver"))
        },
    )
    .await;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_unowned(client.clone(), options.clone(), done.clone());
    tokio::time::sleep_until(t0 + Duration::from_secs(3)).await;
    let second = relay_with(&through, &options, publisher.clone(), timings("successor")).await;
    let second = tokio::spawn(async move { second.run_until(t0 + Duration::from_secs(14)).await });
    let first = first.await.unwrap().unwrap();
    // Bounded by the successor's next regular round (a renew interval) and more.
    let until = Instant::now() + renew * 2;
    while Instant::now() < until
        && !lease_owners(&client, &options)
            .await
            .iter()
            .all(|o| o.as_deref() == Some("successor"))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done.store(true, Ordering::SeqCst);
    let longest = sampler
        .await
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .max()
        .unwrap_or_default();
    let second = second.await.unwrap().unwrap();
    println!(
        "slow handover after the stamp (releases held {hold_for:?}, renew interval {renew:?}): longest unowned {longest:?}"
    );
    assert!(
        first.released && first.stop_reason == StopReason::Deadline,
        "{first:?}"
    );
    assert_eq!(
        proxy.of("leaver"),
        4,
        "the leaver's four releases were held"
    );
    assert_eq!(
        first.refused_total() + second.refused_total(),
        0,
        "{first:?} {second:?}"
    );
    assert_no_refusal_on_the_wire(&wire, "a slow handover after the stamp");
    assert!(
        longest < renew / 2,
        "buckets unowned for {longest:?} after a slow release (renew interval {renew:?})"
    );
}

/// Graceful stops among five relays over 60 buckets, run as overlapping
/// invocations with deadlines (as scheduled Lambda invocations are): every leaver
/// announces its stop, so its four peers re-read together 300 ms after it, while the
/// leaver's twelve releases are still landing, in random order (each held 250 to
/// 450 ms by the proxy, so that they land densely around that re-read). Peers that
/// read between two landings see different halves of the handover. No claim is
/// refused, by the relays' count and at the wire. A newcomer joins half a period before
/// each stop, so every stop leaves four claimers. Ids sort in start order, so the
/// leaver is always first in rank order: after it leaves, the next relay's range covers
/// most of the freed buckets and the rest spill to later relays in the plan's second
/// pass, where plans from different halves of a handover disagree (the worked example
/// of docs/protocol.md, section 4.6). Before the fix this refused 1 to 4 claims per run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_stops_with_releases_landing_in_any_order_refuse_no_claim_among_four_relays() {
    const FLEET: usize = 5;
    const BUCKETS: u32 = 60;
    const STOPS: usize = 12;
    let period = Duration::from_secs(5);
    let client = dynamodb().await;
    let options = fresh_table(&client, BUCKETS).await;
    let publisher = kafka_publisher().await;
    let wire = RequestCounter::default();
    let prefix = random_name("invocation");
    // Only the first STOPS leavers' releases are held: the last relays hold more leases
    // each, with fewer peers, and their stops must fit the stop reserve.
    let tested = prefix.clone();
    let proxy = HoldingProxy::start(Arc::new(move |relay: &str, _| {
        let index = relay
            .strip_prefix(tested.as_str())
            .and_then(|i| i.trim_start_matches('-').parse::<usize>().ok());
        if index.is_some_and(|i| i < STOPS) {
            Duration::from_millis(250 + random_below(200))
        } else {
            Duration::ZERO
        }
    }));
    let through = proxy.client(&wire).await;
    let reserve = dynamo_outbox::relay::DEFAULT_STOP_RESERVE;
    // Relay k stops working at stops[k] (its deadline minus the stop reserve); the
    // first FLEET - 1 start 2 s apart, every later one half a period before the stop of
    // the relay FLEET - 1 places ahead of it. The last ones stop on schedule too, with
    // fewer peers.
    let t0 = Instant::now();
    let relays = STOPS + FLEET - 1;
    let first_stop = Duration::from_secs(2) * (FLEET as u32 - 1) + period;
    let stops: Vec<Instant> = (0..relays)
        .map(|k| t0 + first_stop + period * k as u32)
        .collect();
    let starts: Vec<Instant> = (0..relays)
        .map(|i| {
            if i < FLEET - 1 {
                t0 + Duration::from_secs(2) * i as u32
            } else {
                stops[i - (FLEET - 1)] - period / 2
            }
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_unowned(client.clone(), options.clone(), done.clone());
    let mut running = Vec::new();
    let mut settled = 0;
    for i in 0..relays {
        tokio::time::sleep_until(starts[i]).await;
        // Has the last stop's handover settled: FLEET - 1 relays, the shares apart by
        // at most one?
        if i >= FLEET {
            let counts = owned_counts(&lease_owners(&client, &options).await);
            let (min, max) = (counts.values().min(), counts.values().max());
            if counts.len() == FLEET - 1
                && counts.values().sum::<usize>() == BUCKETS as usize
                && max.zip(min).is_some_and(|(max, min)| max - min <= 1)
            {
                settled += 1;
            }
        }
        // Ids in start order: the leaver, the oldest, is always first in rank order.
        let id = format!("{prefix}-{i:02}");
        let relay = relay_with(
            &through,
            &options,
            publisher.clone(),
            fast_relay_options(&id, BUCKETS),
        )
        .await;
        let deadline = stops[i] + reserve;
        running.push(tokio::spawn(async move { relay.run_until(deadline).await }));
    }
    let mut refused: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut released = 0;
    for r in running {
        let report = r.await.unwrap().unwrap();
        released += usize::from(report.released);
        for (k, v) in &report.refused {
            *refused.entry(k).or_default() += v;
        }
    }
    done.store(true, Ordering::SeqCst);
    let stretches = sampler.await.unwrap();
    // Unowned stretches starting at one of the first STOPS stops (the last ones leave
    // fewer peers, or none, behind).
    let at_stops: Vec<Duration> = stretches
        .iter()
        .filter(|(start, _)| {
            stops[..STOPS]
                .iter()
                .any(|s| *start >= *s && *start < *s + period / 2)
        })
        .map(|(_, d)| *d)
        .collect();
    let longest = at_stops.iter().max().copied().unwrap_or_default();
    println!(
        "{STOPS} graceful stops among {FLEET} relays ({settled} settled half a period later), {} releases held: longest unowned at a stop {longest:?} over {} stretches; refused {refused:?}",
        (0..STOPS).map(|i| proxy.of(&format!("{prefix}-{i:02}"))).sum::<usize>(),
        at_stops.len()
    );
    assert_eq!(released, relays, "every run released its leases");
    let held: usize = (0..STOPS)
        .map(|i| proxy.of(&format!("{prefix}-{i:02}")))
        .sum();
    assert!(held >= STOPS * 6, "the stops' releases were held: {held}");
    assert_eq!(
        refused.values().sum::<u64>(),
        0,
        "refused by the relays: {refused:?} (at the wire {:?})",
        wire.refusals()
    );
    assert_no_refusal_on_the_wire(&wire, "graceful stops with releases in any order");
}

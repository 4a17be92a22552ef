//! Request accounting by purpose: an SDK interceptor that classifies every DynamoDB attempt
//! by what the request is for (a lease renewal, an idle probe, a gap probe, ...), looking
//! at the operation's input before it is sent. The library's
//! [`dynamo_outbox::accounting::RequestCounter`] counts by operation name; the cost model
//! of the specification is stated per purpose, so the benchmarks need this finer view.
//! Attempts are counted (DynamoDB bills attempts, retries included).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::operation::batch_write_item::BatchWriteItemInput;
use aws_sdk_dynamodb::operation::query::QueryInput;
use aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use aws_sdk_dynamodb::types::{AttributeValue, Select};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use dynamo_outbox::accounting::Attempts;

/// What one request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// `Query` of the coordination partition (every lease and heartbeat).
    Coordination,
    /// `UpdateItem` of the relay's heartbeat record.
    Heartbeat,
    /// `UpdateItem` stamping the relay's record as stopped.
    StopStamp,
    /// `UpdateItem` renewing a held lease.
    Renew,
    /// `UpdateItem` claiming a free or lapsed lease.
    Claim,
    /// `UpdateItem` releasing a lease.
    Release,
    /// `DeleteItem` of a stale heartbeat record.
    Cleanup,
    /// Eventually consistent one-item `Query` of a bucket (the idle probe).
    Probe,
    /// Strongly consistent ascending `Query` of a bucket (the batch fetch).
    Fetch,
    /// `COUNT` `Query` of a sequence-number range (a gap probe).
    GapProbe,
    /// `COUNT` `Query` of a whole bucket (the backlog sample).
    BacklogCount,
    /// Head `Query` of a bucket (the backlog sample's oldest-message read).
    BacklogHead,
    /// `BatchWriteItem` deleting published messages (exactly-once: PartiQL
    /// `BatchExecuteStatement`, each delete conditional on the message id).
    Delete,
    /// `BatchWriteItem` putting items (the benchmark's seeding).
    BatchPut,
    /// `UpdateItem ADD Sequence` on a bucket counter (the writer's reservation).
    Reserve,
    /// `TransactWriteItems` (the writer's enqueue).
    Transact,
    /// Anything else.
    Other,
}

impl Class {
    /// Every class, in display order.
    pub const ALL: [Class; 17] = [
        Class::Coordination,
        Class::Heartbeat,
        Class::StopStamp,
        Class::Renew,
        Class::Claim,
        Class::Release,
        Class::Cleanup,
        Class::Probe,
        Class::Fetch,
        Class::GapProbe,
        Class::BacklogCount,
        Class::BacklogHead,
        Class::Delete,
        Class::BatchPut,
        Class::Reserve,
        Class::Transact,
        Class::Other,
    ];

    /// Short lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Coordination => "coordination-query",
            Class::Heartbeat => "heartbeat",
            Class::StopStamp => "stop-stamp",
            Class::Renew => "renew",
            Class::Claim => "claim",
            Class::Release => "release",
            Class::Cleanup => "cleanup",
            Class::Probe => "probe",
            Class::Fetch => "fetch",
            Class::GapProbe => "gap-probe",
            Class::BacklogCount => "backlog-count",
            Class::BacklogHead => "backlog-head",
            Class::Delete => "batch-delete",
            Class::BatchPut => "batch-put",
            Class::Reserve => "reserve",
            Class::Transact => "transact-write",
            Class::Other => "other",
        }
    }

    /// Whether the class is a lease-protocol write (heartbeat, renew, claim, release, ...).
    pub fn is_lease_write(self) -> bool {
        matches!(
            self,
            Class::Heartbeat
                | Class::StopStamp
                | Class::Renew
                | Class::Claim
                | Class::Release
                | Class::Cleanup
        )
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Attempts of one class, by outcome, and the items its queries read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Attempts by outcome (the library's request accounting).
    pub attempts: Attempts,
    /// Items a `Query` read (its `ScannedCount`: a `COUNT` query reads, and DynamoDB bills,
    /// every item it counts), over the operations' final answers.
    pub items_read: u64,
}

impl Outcomes {
    /// Every attempt.
    pub fn total(&self) -> u64 {
        self.attempts.total()
    }
}

/// Counts by class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts(pub BTreeMap<Class, Outcomes>);

impl Counts {
    /// Attempts of one class.
    pub fn get(&self, class: Class) -> u64 {
        self.0.get(&class).map_or(0, Outcomes::total)
    }

    /// Every attempt.
    pub fn total(&self) -> u64 {
        self.0.values().map(Outcomes::total).sum()
    }

    /// Items read by the queries of one class.
    pub fn items_read(&self, class: Class) -> u64 {
        self.0.get(&class).map_or(0, |o| o.items_read)
    }

    /// Attempts answered with a 4xx (a refused conditional write among them).
    pub fn client_errors(&self) -> u64 {
        self.0.values().map(|o| o.attempts.client_error).sum()
    }

    /// Attempts answered with a 5xx or not at all.
    pub fn server_errors(&self) -> u64 {
        self.0.values().map(|o| o.attempts.server_error).sum()
    }

    /// `self - earlier`, class by class.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut out = BTreeMap::new();
        for (class, now) in &self.0 {
            let before = earlier.0.get(class).copied().unwrap_or_default();
            let d = Outcomes {
                attempts: now.attempts.since(&before.attempts),
                items_read: now.items_read - before.items_read,
            };
            if d.total() > 0 {
                out.insert(*class, d);
            }
        }
        Counts(out)
    }

    /// `class=items` pairs of the queries that read items.
    pub fn reads_line(&self) -> String {
        self.0
            .iter()
            .filter(|(_, o)| o.items_read > 0)
            .map(|(c, o)| format!("{c}={}", o.items_read))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `class=count` pairs, for one line of output.
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(c, o)| {
                let a = &o.attempts;
                if a.client_error + a.server_error > 0 {
                    format!(
                        "{c}={} ({} 4xx, {} 5xx)",
                        o.total(),
                        a.client_error,
                        a.server_error
                    )
                } else {
                    format!("{c}={}", o.total())
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The interceptor; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Clone, Copy)]
struct Tag(Class);

impl Storable for Tag {
    type Storer = StoreReplace<Self>;
}

impl Classifier {
    /// The counts so far.
    pub fn snapshot(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the counts.
    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clear();
    }

    fn record_read(&self, class: Class, items: u64) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.0.entry(class).or_default().items_read += items;
    }

    fn record(&self, class: Class, status: Option<u16>) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.0.entry(class).or_default().attempts.record(status);
    }
}

fn partition_key(values: Option<&std::collections::HashMap<String, AttributeValue>>) -> &str {
    values
        .and_then(|v| v.get(":pk"))
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str)
}

fn classify_query(q: &QueryInput) -> Class {
    let pk = partition_key(q.expression_attribute_values());
    if pk.ends_with("#COORDINATION") {
        return Class::Coordination;
    }
    let condition = q.key_condition_expression().unwrap_or_default();
    let count = q.select() == Some(&Select::Count);
    if count && condition.contains("BETWEEN") {
        Class::GapProbe
    } else if count {
        Class::BacklogCount
    } else if q.scan_index_forward() == Some(true) {
        Class::Fetch
    } else if q.projection_expression().is_some() && q.limit() == Some(1) {
        Class::Probe
    } else if q.limit() == Some(1) {
        Class::BacklogHead
    } else {
        Class::Other
    }
}

fn classify_update(u: &UpdateItemInput) -> Class {
    use dynamo_outbox::protocol::schema::{LEASE_SK_PREFIX, RELAY_SK_PREFIX, SEQUENCE_SK};
    let key_strings: Vec<&str> = u
        .key()
        .map(|k| {
            k.values()
                .filter_map(|v| v.as_s().ok())
                .map(String::as_str)
                .collect()
        })
        .unwrap_or_default();
    let has = |f: &dyn Fn(&str) -> bool| key_strings.iter().any(|s| f(s));
    let update = u.update_expression().unwrap_or_default();
    let condition = u.condition_expression().unwrap_or_default();
    if has(&|s| s == SEQUENCE_SK) {
        Class::Reserve
    } else if has(&|s| s.starts_with(RELAY_SK_PREFIX)) {
        if update.contains("#stopped = :now") {
            Class::StopStamp
        } else {
            Class::Heartbeat
        }
    } else if has(&|s| s.starts_with(LEASE_SK_PREFIX)) {
        if update.starts_with("REMOVE") {
            Class::Release
        } else if condition.contains("attribute_not_exists") {
            Class::Claim
        } else {
            Class::Renew
        }
    } else {
        Class::Other
    }
}

fn classify_batch(b: &BatchWriteItemInput) -> Class {
    let puts = b
        .request_items()
        .map(|m| m.values().flatten().any(|w| w.put_request().is_some()))
        .unwrap_or(false);
    if puts {
        Class::BatchPut
    } else {
        Class::Delete
    }
}

impl Intercept for Classifier {
    fn name(&self) -> &'static str {
        "BenchClassifier"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let input = context.input();
        let class = if let Some(q) = input.downcast_ref::<QueryInput>() {
            classify_query(q)
        } else if let Some(u) = input.downcast_ref::<UpdateItemInput>() {
            classify_update(u)
        } else if let Some(b) = input.downcast_ref::<BatchWriteItemInput>() {
            classify_batch(b)
        } else if input
            .downcast_ref::<aws_sdk_dynamodb::operation::batch_execute_statement::BatchExecuteStatementInput>()
            .is_some()
        {
            Class::Delete
        } else if input
            .downcast_ref::<aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsInput>()
            .is_some()
        {
            Class::Transact
        } else if input
            .downcast_ref::<aws_sdk_dynamodb::operation::delete_item::DeleteItemInput>()
            .is_some()
        {
            Class::Cleanup
        } else {
            Class::Other
        };
        cfg.interceptor_state().store_put(Tag(class));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let class = cfg.load::<Tag>().map_or(Class::Other, |t| t.0);
        let status = context.response().map(|r| r.status().as_u16());
        self.record(class, status);
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let class = cfg.load::<Tag>().map_or(Class::Other, |t| t.0);
        if let Some(Ok(output)) = context.output_or_error() {
            if let Some(q) =
                output.downcast_ref::<aws_sdk_dynamodb::operation::query::QueryOutput>()
            {
                self.record_read(class, q.scanned_count().max(0) as u64);
            }
        }
        Ok(())
    }
}

//! One configurable fault of a DynamoDB client, for tests: which requests it hits (an
//! operation, optionally only requests whose JSON body passes a check), how many times,
//! whether it is armed, and what it does to them (fail before sending, delay, hold until
//! released, lose the answer of a request that landed, edit the input, run code on the
//! answer). Attach it with [`faulty_dynamodb`] or `Builder::interceptor(fault.clone())`;
//! the test keeps its clone to arm, count, read what was sent or release a held request.
//!
//! ```
//! use outbox_testkit::Fault;
//!
//! // The next 15 deletes land and their answers are lost.
//! let lose = Fault::on("BatchWriteItem").times(15).lose_answer();
//! // Every UpdateItem fails while armed (an outage of writes).
//! let outage = Fault::on("UpdateItem").disarmed().fail("injected: UpdateItem unavailable");
//! outage.arm();
//! assert_eq!((lose.hits(), outage.hits()), (0, 0));
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeDeserializationInterceptorContextMut,
    BeforeSerializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{Input, Output};
use aws_smithy_types::config_bag::{Storable, StoreReplace};

use crate::operation_is;

/// How long a held request waits for [`Fault::release`] at most.
const HOLD_LIMIT: Duration = Duration::from_secs(20);

/// The body of an injected `InternalServerError` (a 500, which the SDK retries).
const LOST_ANSWER: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected: the answer was lost"}"#;

/// The body of an injected throttle (a 400 the SDK retries with its throttling back-off).
const THROTTLED: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"injected: the partition is throttled"}"#;

/// Code run on an answer (`None`: an error answer).
type OnAnswer = dyn Fn(Option<&Output>) + Send + Sync;

/// What a [`Fault`] does to a request it hits.
enum Action {
    /// Fails the attempt before it is sent, with this message.
    Fail(&'static str),
    /// Blocks the sending thread this long before the attempt is sent.
    Delay(Duration),
    /// Blocks the sending thread until [`Fault::release`] (at most [`HOLD_LIMIT`]).
    HoldBeforeSend,
    /// Blocks once DynamoDB answered with a success, until [`Fault::release`].
    HoldAfterAnswer,
    /// Turns a successful answer (the request landed) into a 500 the SDK retries.
    LoseAnswer,
    /// Turns an answer into a throttle (`ProvisionedThroughputExceededException`, 400).
    Throttle,
    /// Edits the input before it is serialized; hits only when the edit says it applied.
    Edit(fn(&mut Input) -> bool),
    /// Runs with the answer once it is deserialized (`None`: an error answer).
    AfterAnswer(Box<OnAnswer>),
    /// Nothing: counts and records the requests it matches.
    Observe,
}

/// A configurable fault of a DynamoDB client: an interceptor (every clone shares its
/// state). Built by [`Fault::on`].
#[derive(Clone)]
pub struct Fault(Arc<Inner>);

struct Inner {
    id: u64,
    operation: &'static str,
    when: Option<fn(&serde_json::Value) -> bool>,
    /// Hits left; `None`: every matching attempt.
    left: Option<AtomicU32>,
    armed: AtomicBool,
    record: bool,
    action: Action,
    hits: AtomicUsize,
    sent: Mutex<Vec<serde_json::Value>>,
    /// A request is held (sent by the holding thread, received by [`Fault::wait_held`]).
    held: Channel,
    /// The test lets it go (sent by [`Fault::release`], received by the holding thread).
    release: Channel,
}

/// One channel, each end behind its own lock: a thread waiting on one end never blocks
/// the other.
struct Channel {
    tx: Mutex<mpsc::Sender<()>>,
    rx: Mutex<mpsc::Receiver<()>>,
}

impl Channel {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        Channel {
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
        }
    }

    fn send(&self) {
        let _ = self.tx.lock().unwrap().send(());
    }

    fn recv(&self, timeout: Duration) -> bool {
        self.rx.lock().unwrap().recv_timeout(timeout).is_ok()
    }
}

/// The settings of a [`Fault`] before its action is chosen.
#[derive(Debug)]
pub struct FaultBuilder {
    operation: &'static str,
    when: Option<fn(&serde_json::Value) -> bool>,
    times: Option<u32>,
    armed: bool,
    record: bool,
}

impl Fault {
    /// A fault of the DynamoDB operation `operation` (`"Query"`, `"UpdateItem"`, ...): by
    /// default armed, hitting every attempt, recording nothing.
    pub fn on(operation: &'static str) -> FaultBuilder {
        FaultBuilder {
            operation,
            when: None,
            times: None,
            armed: true,
            record: false,
        }
    }

    /// Arms the fault: it hits matching requests from now on.
    pub fn arm(&self) {
        self.0.armed.store(true, Ordering::SeqCst);
    }

    /// Disarms the fault: requests pass untouched until [`Fault::arm`].
    pub fn disarm(&self) {
        self.0.armed.store(false, Ordering::SeqCst);
    }

    /// How many requests the fault hit so far.
    pub fn hits(&self) -> usize {
        self.0.hits.load(Ordering::SeqCst)
    }

    /// The JSON bodies of the matching attempts sent so far (with
    /// [`FaultBuilder::recording`]), hit or not.
    pub fn sent(&self) -> Vec<serde_json::Value> {
        self.0.sent.lock().unwrap().clone()
    }

    /// Waits (blocking the thread) until a request is held, at most `timeout`; whether
    /// one was.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        self.0.held.recv(timeout)
    }

    /// Lets a held request (or the next one to be held) go on.
    pub fn release(&self) {
        self.0.release.send();
    }

    /// Takes one hit if the fault is armed and has hits left.
    fn take_hit(&self) -> bool {
        let inner = &self.0;
        if !inner.armed.load(Ordering::SeqCst) {
            return false;
        }
        let took = inner.left.as_ref().is_none_or(|left| {
            left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        });
        if took {
            inner.hits.fetch_add(1, Ordering::SeqCst);
        }
        took
    }

    fn hold(&self) {
        self.0.held.send();
        self.0.release.recv(HOLD_LIMIT);
    }

    /// Whether the current attempt matched when it was sent (operation and body check).
    fn matched(&self, cfg: &ConfigBag) -> bool {
        cfg.load::<Matched>()
            .is_some_and(|m| m.0.contains(&self.0.id))
    }

    fn remember(&self, cfg: &mut ConfigBag, matched: bool) {
        let mut m = cfg.load::<Matched>().cloned().unwrap_or_default();
        m.0.retain(|&id| id != self.0.id);
        if matched {
            m.0.push(self.0.id);
        }
        cfg.interceptor_state().store_put(m);
    }
}

impl FaultBuilder {
    /// Only requests whose JSON body passes `check`.
    pub fn when(mut self, check: fn(&serde_json::Value) -> bool) -> Self {
        self.when = Some(check);
        self
    }

    /// At most `n` hits (each attempt the SDK makes is one request).
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Starts disarmed ([`Fault::arm`] arms it).
    pub fn disarmed(mut self) -> Self {
        self.armed = false;
        self
    }

    /// Keeps the JSON body of every matching attempt ([`Fault::sent`]).
    pub fn recording(mut self) -> Self {
        self.record = true;
        self
    }

    /// Fails the attempt before it is sent (an error the SDK treats as a transport failure).
    pub fn fail(self, message: &'static str) -> Fault {
        self.build(Action::Fail(message))
    }

    /// Blocks the sending thread for `delay` before the attempt is sent (a worker of a
    /// multi-threaded test runtime; the others go on).
    pub fn delay(self, delay: Duration) -> Fault {
        self.build(Action::Delay(delay))
    }

    /// Blocks the sending thread before the attempt is sent until the test calls
    /// [`Fault::release`] (at most 20 s); [`Fault::wait_held`] waits for it.
    pub fn hold_before_send(self) -> Fault {
        self.build(Action::HoldBeforeSend)
    }

    /// Like [`FaultBuilder::hold_before_send`], once DynamoDB answered with a success.
    pub fn hold_after_answer(self) -> Fault {
        self.build(Action::HoldAfterAnswer)
    }

    /// Answers a request that landed with an injected 500 `InternalServerError`, so the
    /// SDK (or the caller) retries a write that was applied.
    pub fn lose_answer(self) -> Fault {
        self.build(Action::LoseAnswer)
    }

    /// Answers with a throttle (`ProvisionedThroughputExceededException`) in place of
    /// DynamoDB's answer: a hot partition, as a read-only request sees it.
    pub fn throttle(self) -> Fault {
        self.build(Action::Throttle)
    }

    /// Edits the input before it is serialized; `edit` says whether it applied (a hit).
    pub fn edit(self, edit: fn(&mut Input) -> bool) -> Fault {
        self.build(Action::Edit(edit))
    }

    /// Runs `f` with each answer once deserialized (`None` for an error answer).
    pub fn after_answer(self, f: impl Fn(Option<&Output>) + Send + Sync + 'static) -> Fault {
        self.build(Action::AfterAnswer(Box::new(f)))
    }

    /// Changes nothing: counts ([`Fault::hits`]) and, [`recording`](Self::recording),
    /// keeps the matching requests.
    pub fn observe(self) -> Fault {
        self.build(Action::Observe)
    }

    fn build(self, action: Action) -> Fault {
        static IDS: AtomicU64 = AtomicU64::new(0);
        Fault(Arc::new(Inner {
            id: IDS.fetch_add(1, Ordering::SeqCst),
            operation: self.operation,
            when: self.when,
            left: self.times.map(AtomicU32::new),
            armed: AtomicBool::new(self.armed),
            record: self.record,
            action,
            hits: AtomicUsize::new(0),
            sent: Mutex::default(),
            held: Channel::new(),
            release: Channel::new(),
        }))
    }
}

/// The faults whose check the current attempt passed when it was sent (read by the hooks
/// after the answer, which no longer have the request).
#[derive(Debug, Clone, Default)]
struct Matched(Vec<u64>);

impl Storable for Matched {
    type Storer = StoreReplace<Self>;
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match &self.0.action {
            Action::Fail(m) => format!("Fail({m:?})"),
            Action::Delay(d) => format!("Delay({d:?})"),
            Action::HoldBeforeSend => "HoldBeforeSend".into(),
            Action::HoldAfterAnswer => "HoldAfterAnswer".into(),
            Action::LoseAnswer => "LoseAnswer".into(),
            Action::Throttle => "Throttle".into(),
            Action::Edit(_) => "Edit".into(),
            Action::AfterAnswer(_) => "AfterAnswer".into(),
            Action::Observe => "Observe".into(),
        };
        f.debug_struct("Fault")
            .field("operation", &self.0.operation)
            .field("action", &action)
            .field("armed", &self.0.armed.load(Ordering::SeqCst))
            .field("hits", &self.hits())
            .finish()
    }
}

impl Intercept for Fault {
    fn name(&self) -> &'static str {
        "Fault"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Action::Edit(edit) = &self.0.action {
            if operation_is(cfg, self.0.operation)
                && self.0.armed.load(Ordering::SeqCst)
                && self
                    .0
                    .left
                    .as_ref()
                    .is_none_or(|l| l.load(Ordering::SeqCst) > 0)
                && edit(context.input_mut())
            {
                self.take_hit();
            }
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let inner = &self.0;
        if !operation_is(cfg, inner.operation) {
            return Ok(());
        }
        let body = (inner.when.is_some() || inner.record).then(|| {
            context
                .request()
                .body()
                .bytes()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                .unwrap_or_default()
        });
        let matched = match (inner.when, &body) {
            (Some(check), Some(body)) => check(body),
            _ => true,
        };
        if inner.record && matched {
            inner.sent.lock().unwrap().push(body.unwrap_or_default());
        }
        self.remember(cfg, matched);
        if !matched {
            return Ok(());
        }
        match inner.action {
            Action::Fail(message) if self.take_hit() => return Err(message.into()),
            Action::Delay(delay) if self.take_hit() => std::thread::sleep(delay),
            Action::HoldBeforeSend if self.take_hit() => self.hold(),
            _ => {}
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if matches!(self.0.action, Action::LoseAnswer)
            && self.matched(cfg)
            && context.response().status().is_success()
            && self.take_hit()
        {
            let response = context.response_mut();
            *response.status_mut() = 500u16.try_into()?;
            *response.body_mut() = aws_smithy_types::body::SdkBody::from(LOST_ANSWER);
        } else if matches!(self.0.action, Action::Throttle) && self.matched(cfg) && self.take_hit()
        {
            let response = context.response_mut();
            *response.status_mut() = 400u16.try_into()?;
            *response.body_mut() = aws_smithy_types::body::SdkBody::from(THROTTLED);
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Action::AfterAnswer(f) = &self.0.action {
            if self.matched(cfg) && self.take_hit() {
                f(context.output_or_error().ok());
            }
        }
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if matches!(self.0.action, Action::HoldAfterAnswer)
            && self.matched(cfg)
            && context.response().is_some_and(|r| r.status().is_success())
            && self.take_hit()
        {
            self.hold();
        }
        Ok(())
    }
}

/// The configuration of a DynamoDB client for the local stack (that of
/// [`crate::dynamodb`]), to attach faults and counters to.
pub async fn dynamodb_builder() -> aws_sdk_dynamodb::config::Builder {
    let config = crate::try_sdk_config()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    aws_sdk_dynamodb::config::Builder::from(&config)
}

/// A DynamoDB client for the local stack with `fault` attached.
pub async fn faulty_dynamodb(fault: &Fault) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_builder().await.interceptor(fault.clone()).build())
}

//! The Kafka names and the watermark of exactly-once delivery
//! ([protocol.md, section 8.1](../../../docs/protocol.md)).
//!
//! Pure: what a bucket's transactional id and group are called, and the watermark's text,
//! which lists every message of the bucket that was published in a committed transaction
//! and is not known to be deleted (the *in-doubt set*), each by its sequence number and a
//! fingerprint of its message id. A watermark is read back from the broker, where anyone
//! with the group's permissions may have written it: decoding checks every rule and never
//! panics.

use std::collections::BTreeMap;
use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The largest watermark text a relay writes: Kafka refuses offset metadata above
/// `offset.metadata.max.bytes`, 4,096 bytes by default, and the rest is headroom.
pub const MAX_WATERMARK_BYTES: usize = 4000;

/// The most messages an exactly-once batch holds: their watermark fits in
/// [`MAX_WATERMARK_BYTES`] with room to spare when their sequence numbers have few holes
/// (about 300 fit without any).
pub const EXACTLY_ONCE_BATCH_LIMIT: u32 = 250;

/// The start of every transactional id and group id of the outbox (the prefix ACLs and
/// IAM policies name).
pub const KAFKA_NAME_PREFIX: &str = "dynamo-outbox";

/// The topic the watermarks are committed against when `OUTBOX_WATERMARK_TOPIC` is unset.
pub const DEFAULT_WATERMARK_TOPIC: &str = "dynamo-outbox-watermarks";

/// The watermark text's version tag.
const VERSION: &str = "v1";

/// Characters of a fingerprint in the text (8 bytes, unpadded base64url).
const FINGERPRINT_CHARS: usize = 11;

/// Characters of a bucket identity (16 hex digits).
const ID_CHARS: usize = 16;

/// A table and key prefix as Kafka names know them: the table's name (for people) and the
/// first 16 hex digits of SHA-256 of `{table ARN}#{key prefix}` (so two tables of one name
/// in two accounts or regions, or two prefixes of one table, never share a name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxIdentity {
    table_name: String,
    id: String,
}

impl OutboxIdentity {
    /// The identity of the outbox under `key_prefix` in the table `table_arn` (whose name
    /// is the ARN's part after `table/`, or the whole ARN when it has none).
    pub fn new(table_arn: &str, key_prefix: &str) -> Self {
        let table_name = table_arn
            .rsplit_once(":table/")
            .map_or(table_arn, |(_, name)| name)
            .to_string();
        let digest = Sha256::digest(format!("{table_arn}#{key_prefix}").as_bytes());
        let id = digest[..ID_CHARS / 2]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        OutboxIdentity { table_name, id }
    }

    /// The 16 hex digits that tell this outbox apart.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The transactional id of `bucket`: `dynamo-outbox.{table name}.{id}.{bucket}`.
    pub fn transactional_id(&self, bucket: u32) -> String {
        format!(
            "{KAFKA_NAME_PREFIX}.{}.{}.{bucket}",
            self.table_name, self.id
        )
    }

    /// The group whose committed offset holds `bucket`'s watermark: the same string as its
    /// transactional id (groups and transactional ids are separate namespaces).
    pub fn group_id(&self, bucket: u32) -> String {
        self.transactional_id(bucket)
    }

    /// An empty watermark of `bucket`.
    pub fn empty_watermark(&self, bucket: u32) -> Watermark {
        Watermark {
            id: self.id.clone(),
            bucket,
            entries: BTreeMap::new(),
        }
    }
}

/// The first 8 bytes of SHA-256 of a message id's text as its header carries it
/// (lowercase, hyphenated).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 8]);

impl Fingerprint {
    /// The fingerprint of `message_id`.
    pub fn of(message_id: &Uuid) -> Self {
        let digest = Sha256::digest(message_id.hyphenated().to_string().as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        Fingerprint(bytes)
    }

    fn parse(text: &str) -> Option<Self> {
        if text.len() != FINGERPRINT_CHARS {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let bytes: [u8; 8] = bytes.try_into().ok()?;
        let fingerprint = Fingerprint(bytes);
        // One text per value: base64 leaves 2 bits of the last character unused.
        (fingerprint.to_string() == text).then_some(fingerprint)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// A bucket's watermark: the in-doubt set of one outbox's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watermark {
    id: String,
    bucket: u32,
    entries: BTreeMap<u64, Fingerprint>,
}

/// Why a watermark text was refused: the rule it breaks, never the text itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatermarkError {
    /// The text breaks the format of protocol.md section 8.1.
    #[error("watermark: {0}")]
    Malformed(&'static str),
    /// The watermark is another outbox's or another bucket's.
    #[error(
        "watermark: it belongs to outbox {found_id} bucket {found_bucket}, not to outbox \
         {id} bucket {bucket}: the group is shared with another outbox; nothing in the \
         bucket is published or deleted"
    )]
    Foreign {
        /// This outbox's identity.
        id: String,
        /// This bucket.
        bucket: u32,
        /// The identity the watermark names.
        found_id: String,
        /// The bucket the watermark names.
        found_bucket: u32,
    },
}

impl Watermark {
    /// The bucket the watermark is of.
    pub fn bucket(&self) -> u32 {
        self.bucket
    }

    /// Whether the in-doubt set is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many messages are in doubt.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The sequence numbers in doubt, ascending.
    pub fn sequences(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.keys().copied()
    }

    /// The highest sequence number in doubt (the committed offset shows it).
    pub fn highest(&self) -> Option<u64> {
        self.entries.keys().next_back().copied()
    }

    /// Whether the message `message_id` at `sequence` was published: its sequence number is
    /// in the set *and* its id has the fingerprint listed there. A message that committed
    /// later into a hole, or that reuses a number after a counter reset, is not covered.
    pub fn covers(&self, sequence: u64, message_id: &Uuid) -> bool {
        self.entries.get(&sequence) == Some(&Fingerprint::of(message_id))
    }

    /// Adds a published message.
    pub fn insert(&mut self, sequence: u64, message_id: &Uuid) {
        self.entries.insert(sequence, Fingerprint::of(message_id));
    }

    /// Drops a message that is known to be deleted; whether it was there.
    pub fn remove(&mut self, sequence: u64) -> bool {
        self.entries.remove(&sequence).is_some()
    }

    /// How many of `candidates` (a batch's sequence numbers, in order; a message that
    /// committed late into a hole may lie below the set's highest) can join the set with
    /// its text staying within [`MAX_WATERMARK_BYTES`]: the batch is cut there. An entry's
    /// length does not depend on its fingerprint, so none is needed.
    pub fn room_for(&self, candidates: impl IntoIterator<Item = u64>) -> usize {
        // Every entry takes at least a separator and a fingerprint: no more can fit.
        let most = MAX_WATERMARK_BYTES / (FINGERPRINT_CHARS + 1) + 1;
        let candidates: Vec<u64> = candidates.into_iter().take(most).collect();
        let fits = |k: usize| {
            let mut w = self.clone();
            for &sequence in &candidates[..k] {
                w.entries.insert(sequence, Fingerprint([0; 8]));
            }
            w.encoded_len() <= MAX_WATERMARK_BYTES
        };
        // The largest k that fits (fitting only gets harder as k grows).
        if fits(candidates.len()) {
            return candidates.len();
        }
        let (mut lo, mut hi) = (0, candidates.len());
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The text's length in bytes.
    pub fn encoded_len(&self) -> usize {
        self.encode().len()
    }

    /// The text: `v1 {id} {bucket} {first sequence} {fingerprint}[,{step}{fingerprint}]...`,
    /// `{step}` the difference to the previous sequence number in base 36; `-` for an empty
    /// set.
    pub fn encode(&self) -> String {
        let mut text = format!("{VERSION} {} {} ", self.id, self.bucket);
        let mut previous: Option<u64> = None;
        for (&sequence, fingerprint) in &self.entries {
            match previous {
                None => text.push_str(&format!("{sequence} ")),
                Some(p) => {
                    text.push(',');
                    text.push_str(&base36(sequence - p));
                }
            }
            text.push_str(&fingerprint.to_string());
            previous = Some(sequence);
        }
        if previous.is_none() {
            text.push('-');
        }
        text
    }

    /// Reads a watermark's text, checking every rule of the format.
    pub fn decode(text: &str) -> Result<Watermark, WatermarkError> {
        use WatermarkError::Malformed;
        let mut parts = text.split(' ');
        if parts.next() != Some(VERSION) {
            return Err(Malformed("does not start with `v1 `"));
        }
        let id = parts.next().ok_or(Malformed("no outbox identity"))?;
        if id.len() != ID_CHARS || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Malformed(
                "the outbox identity is not 16 lowercase hex digits",
            ));
        }
        let bucket = parts
            .next()
            .and_then(parse_decimal)
            .and_then(|b| u32::try_from(b).ok())
            .ok_or(Malformed("the bucket is not a decimal number below 2^32"))?;
        let mut entries = BTreeMap::new();
        match parts.next() {
            Some("-") => {}
            Some(first) => {
                let mut sequence = parse_decimal(first).ok_or(Malformed(
                    "the first sequence number is not a decimal number",
                ))?;
                let list = parts.next().ok_or(Malformed("no fingerprints"))?;
                for (i, entry) in list.split(',').enumerate() {
                    if entry.len() < FINGERPRINT_CHARS {
                        return Err(Malformed("an entry is shorter than a fingerprint"));
                    }
                    let (step, fingerprint) = entry.split_at(entry.len() - FINGERPRINT_CHARS);
                    if i == 0 {
                        if !step.is_empty() {
                            return Err(Malformed("the first entry has a step"));
                        }
                    } else {
                        let step = parse_base36(step)
                            .filter(|&s| s >= 1)
                            .ok_or(Malformed("a step is not a base-36 number of at least 1"))?;
                        sequence = sequence
                            .checked_add(step)
                            .ok_or(Malformed("a sequence number exceeds 2^64"))?;
                    }
                    let fingerprint = Fingerprint::parse(fingerprint)
                        .ok_or(Malformed("a fingerprint is not 11 characters of base64url"))?;
                    entries.insert(sequence, fingerprint);
                }
            }
            None => return Err(Malformed("no in-doubt set")),
        }
        if parts.next().is_some() {
            return Err(Malformed("trailing text"));
        }
        Ok(Watermark {
            id: id.to_string(),
            bucket,
            entries,
        })
    }

    /// Refuses a watermark that is not `bucket`'s of `identity`.
    pub fn check_belongs(
        &self,
        identity: &OutboxIdentity,
        bucket: u32,
    ) -> Result<(), WatermarkError> {
        if self.id == identity.id && self.bucket == bucket {
            return Ok(());
        }
        Err(WatermarkError::Foreign {
            id: identity.id.clone(),
            bucket,
            found_id: self.id.clone(),
            found_bucket: self.bucket,
        })
    }
}

/// A decimal number without sign or leading zeros (but `0` itself).
fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty()
        || (text.len() > 1 && text.starts_with('0'))
        || !text.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    text.parse().ok()
}

/// A base-36 number in lowercase without leading zeros.
fn parse_base36(text: &str) -> Option<u64> {
    if text.is_empty()
        || text.starts_with('0')
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        return None;
    }
    u64::from_str_radix(text, 36).ok()
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ARN: &str = "arn:aws:dynamodb:eu-west-1:123456789012:table/Orders";

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn names_carry_the_table_and_tell_accounts_and_prefixes_apart() {
        let a = OutboxIdentity::new(ARN, "OUTBOX");
        assert_eq!(a.id().len(), 16);
        assert_eq!(
            a.transactional_id(3),
            format!("dynamo-outbox.Orders.{}.3", a.id())
        );
        assert_eq!(a.group_id(3), a.transactional_id(3));
        let other_account = OutboxIdentity::new(
            "arn:aws:dynamodb:eu-west-1:210987654321:table/Orders",
            "OUTBOX",
        );
        let other_prefix = OutboxIdentity::new(ARN, "BILLING");
        assert_ne!(a.id(), other_account.id());
        assert_ne!(a.id(), other_prefix.id());
        assert_eq!(a, OutboxIdentity::new(ARN, "OUTBOX"));
    }

    #[test]
    fn covers_needs_the_number_and_the_id() {
        let identity = OutboxIdentity::new(ARN, "OUTBOX");
        let mut w = identity.empty_watermark(2);
        w.insert(5, &id(1));
        w.insert(7, &id(2));
        assert!(w.covers(5, &id(1)));
        // A message that committed later into the hole at 6.
        assert!(!w.covers(6, &id(3)));
        // A reused number (a counter reset): another id.
        assert!(!w.covers(7, &id(4)));
        assert!(w.remove(5));
        assert!(!w.covers(5, &id(1)));
        assert!(!w.remove(5));
    }

    #[test]
    fn the_text_lists_each_entry_with_steps() {
        let identity = OutboxIdentity::new(ARN, "OUTBOX");
        let mut w = identity.empty_watermark(2);
        assert_eq!(w.encode(), format!("v1 {} 2 -", identity.id()));
        for (sequence, n) in [(41, 1), (42, 2), (80, 3)] {
            w.insert(sequence, &id(n));
        }
        let text = w.encode();
        let f = |n| Fingerprint::of(&id(n)).to_string();
        assert_eq!(
            text,
            format!("v1 {} 2 41 {},1{},12{}", identity.id(), f(1), f(2), f(3))
        );
        assert_eq!(Watermark::decode(&text), Ok(w.clone()));
        assert!(w.check_belongs(&identity, 2).is_ok());
        assert!(matches!(
            w.check_belongs(&identity, 3),
            Err(WatermarkError::Foreign { .. })
        ));
    }

    #[test]
    fn refused_texts_name_the_rule() {
        let good = {
            let mut w = OutboxIdentity::new(ARN, "OUTBOX").empty_watermark(0);
            w.insert(1, &id(1));
            w.insert(2, &id(2));
            w.encode()
        };
        assert!(Watermark::decode(&good).is_ok());
        let fp = &good[good.len() - FINGERPRINT_CHARS..];
        let idt = &good[3..19];
        for (text, rule) in [
            ("", "does not start"),
            ("v2 x", "does not start"),
            ("v1 XYZ 0 -", "identity"),
            (&format!("v1 {idt} -1 -"), "bucket"),
            (&format!("v1 {idt} 01 -"), "bucket"),
            (&format!("v1 {idt} 4294967296 -"), "bucket"),
            (&format!("v1 {idt} 0"), "no in-doubt set"),
            (&format!("v1 {idt} 0 5"), "no fingerprints"),
            (&format!("v1 {idt} 0 x {fp}"), "first sequence"),
            (&format!("v1 {idt} 0 5 1{fp}"), "first entry has a step"),
            (&format!("v1 {idt} 0 5 {fp},0{fp}"), "step"),
            (&format!("v1 {idt} 0 5 {fp},A{fp}"), "step"),
            (&format!("v1 {idt} 0 5 {fp},1abc"), "shorter"),
            (&format!("v1 {idt} 0 5 {fp},1+{}", &fp[1..]), "base64url"),
            (
                &format!("v1 {idt} 0 18446744073709551615 {fp},1{fp}"),
                "exceeds",
            ),
            (&format!("v1 {idt} 0 - x"), "trailing"),
        ] {
            let err = Watermark::decode(text).expect_err(text).to_string();
            assert!(err.contains(rule), "{text:?}: {err}");
            assert!(!err.contains(fp), "the error quotes the text: {err}");
        }
    }

    #[test]
    fn room_for_keeps_the_text_within_the_limit() {
        let identity = OutboxIdentity::new(ARN, "OUTBOX");
        let mut w = identity.empty_watermark(7);
        let fits = w.room_for(1_000_000..2_000_000);
        assert!(
            (290..=310).contains(&fits),
            "{fits} consecutive messages fit"
        );
        for (i, sequence) in (1_000_000..).take(fits).enumerate() {
            w.insert(sequence, &id(i as u128));
        }
        assert!(w.encoded_len() <= MAX_WATERMARK_BYTES);
        let mut one_more = w.clone();
        one_more.insert(1_000_000 + fits as u64, &id(u128::MAX));
        assert!(one_more.encoded_len() > MAX_WATERMARK_BYTES);
        assert_eq!(w.room_for([3_000_000]), 0);
        // Carried entries leave less room.
        let mut carried = identity.empty_watermark(7);
        carried.insert(10, &id(1));
        assert_eq!(
            carried.room_for(11..1_000),
            identity.empty_watermark(7).room_for(10..1_000) - 1
        );
    }

    proptest! {
        #[test]
        fn any_set_round_trips_and_room_for_is_exact(
            bucket in 0u32..10_000_000,
            steps in proptest::collection::vec(1u64..5_000_000, 0..400),
            first in 1u64..u64::MAX / 4,
        ) {
            let identity = OutboxIdentity::new(ARN, "P");
            let mut sequences = Vec::new();
            let mut s = first;
            for step in steps {
                s += step;
                sequences.push(s);
            }
            let room = identity.empty_watermark(bucket).room_for(sequences.iter().copied());
            let with = |k: usize| {
                let mut w = identity.empty_watermark(bucket);
                for (i, &sequence) in sequences[..k].iter().enumerate() {
                    w.insert(sequence, &id(i as u128));
                }
                w
            };
            let fitting = with(room);
            prop_assert!(fitting.encoded_len() <= MAX_WATERMARK_BYTES);
            if room < sequences.len() {
                prop_assert!(with(room + 1).encoded_len() > MAX_WATERMARK_BYTES);
            }
            prop_assert_eq!(Watermark::decode(&fitting.encode()), Ok(fitting));
        }

        #[test]
        fn any_text_decodes_or_is_refused_without_panicking(text in ".{0,200}") {
            let _ = Watermark::decode(&text);
        }
    }
}

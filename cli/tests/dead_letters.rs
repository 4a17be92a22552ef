//! The `outboxctl dead-letters` binary against DynamoDB Local: `list --json` with a filter,
//! `show`, `redrive --dry-run` (writes nothing), `redrive`, a redrive refused for another
//! bucket count (exit 2), and `purge` refused without `--yes` (exit 2, nothing deleted),
//! then with it.

use std::process::{Command, Output};

use dynamo_outbox::dead_letters::{self, Filter};
use dynamo_outbox::{DynamoDbOutboxStore, DynamoDbOutboxWriter, Header};
use outbox_testkit::*;
use serde_json::Value;

fn outboxctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outboxctl"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outboxctl")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn purge_without_yes_is_refused_before_anything_is_read() {
    // No table, no stack needed: the refusal comes first.
    let out = outboxctl(&["dead-letters", "purge", "--table", "no-such-table"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("purge: refused without --yes") && err.contains("deleted for good"),
        "{err}"
    );
    let help = text(&outboxctl(&["dead-letters", "--help"]).stdout);
    for sub in ["list", "show", "redrive", "purge"] {
        assert!(help.contains(sub), "{help}");
    }
    let redrive = text(&outboxctl(&["dead-letters", "redrive", "--help"]).stdout);
    assert!(
        redrive.contains("tail") && redrive.contains("--dry-run") && redrive.contains("--limit"),
        "{redrive}"
    );
    // A limit beyond the bound is a usage error naming the flag.
    let out = outboxctl(&[
        "dead-letters",
        "redrive",
        "--limit",
        "5000",
        "--table",
        "t-123",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--limit"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn list_show_redrive_and_purge_through_the_binary() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 4).await;
    let table = options.table_name.clone();
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let base = ["--table", table.as_str(), "--bucket-count", "4"];
    let run = |args: &[&str]| {
        let mut v: Vec<&str> = vec!["dead-letters"];
        v.extend_from_slice(args);
        v.extend_from_slice(&base);
        outboxctl(&v)
    };

    let a = writer
        .message("orders")
        .with_partition(1)
        .with_key("customer-1")
        .with_value("{\"total\": 12}")
        .with_header(Header::new("type", b"created".to_vec()));
    let b = writer.message("audit").with_partition(3).with_value("b");
    let placed = writer.enqueue(&[a.clone(), b.clone()]).await.unwrap();
    let (a_seq, b_seq) = (placed[0].sequence, placed[1].sequence);
    store.quarantine(1, a_seq).await.unwrap();
    store.quarantine(3, b_seq).await.unwrap();
    // One from a writer with 8 buckets, wherever its key lands under 8.
    let foreign =
        DynamoDbOutboxWriter::new(client.clone(), options.clone().with_bucket_count(8)).unwrap();
    let f = foreign.message("orders").with_key("customer-2");
    let fp = foreign.enqueue(std::slice::from_ref(&f)).await.unwrap()[0];
    DynamoDbOutboxStore::new(client.clone(), options.clone().with_bucket_count(8))
        .unwrap()
        .quarantine(fp.bucket, fp.sequence)
        .await
        .unwrap();

    // list --json, all and by topic.
    let listed = json(&run(&["list", "--json"]));
    assert_eq!(
        listed["dead_letters"].as_array().unwrap().len(),
        3,
        "{listed}"
    );
    assert_eq!(listed["more"], false);
    let audit = json(&run(&["list", "--topic", "audit", "--json"]));
    let audit = audit["dead_letters"].as_array().unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["message_id"], b.message_id.to_string());
    assert_eq!(audit[0]["bucket"], 3);
    assert_eq!(audit[0]["reason"], "moved by an operator");
    // --older-than: all three were quarantined a moment ago.
    let old = json(&run(&["list", "--older-than", "1h", "--json"]));
    assert_eq!(old["dead_letters"].as_array().unwrap().len(), 0, "{old}");
    let table_text = text(&run(&["list", "--bucket", "1"]).stdout);
    assert!(
        table_text.contains("MESSAGE ID") && table_text.contains(&a.message_id.to_string()),
        "{table_text}"
    );

    // show: everything about one.
    let seq = a_seq.to_string();
    let shown = json(&run(&["show", "1", &seq, "--json"]));
    assert_eq!(shown["message_id"], a.message_id.to_string());
    assert_eq!(shown["sequence"], a_seq);
    assert_eq!(shown["key"]["utf8"], "customer-1");
    assert_eq!(shown["value"]["bytes"], 13);
    assert_eq!(shown["value"]["utf8_preview"], "{\"total\": 12}");
    assert_eq!(shown["headers"][0]["key"], "type");
    assert_eq!(shown["headers"][0]["value"]["utf8"], "created");
    assert!(shown["quarantined_at"].as_str().unwrap().ends_with('Z'));
    let missing = run(&["show", "1", "999"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("no dead letter from bucket 1, sequence 999"));

    // redrive --dry-run: says what it would do, writes nothing.
    let counter = store.sequence_counter(1).await.unwrap();
    let dry = json(&run(&["redrive", "--bucket", "1", "--dry-run", "--json"]));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        dry["would_redrive"][0]["message_id"],
        a.message_id.to_string()
    );
    assert_eq!(store.sequence_counter(1).await.unwrap(), counter);
    assert_eq!(
        dead_letters::list(&store, &Filter::default(), 10)
            .await
            .unwrap()
            .0
            .len(),
        3
    );

    // redrive of everything, limit 10: the two of this outbox go back, the foreign one is
    // refused (exit 2) and stays.
    let out = run(&["redrive", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    let redriven: Vec<&str> = done["redriven"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(redriven.len(), 2, "{done}");
    assert!(redriven.contains(&a.message_id.to_string().as_str()));
    assert_eq!(done["redriven"][0]["sequence"], counter.unwrap() + 1);
    let refused = done["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{done}");
    let why = refused[0]["error"].as_str().unwrap();
    assert!(
        why.contains("stamped with bucket count 8") && why.contains("OUTBOX_BUCKET_COUNT"),
        "{why}"
    );
    assert!(
        text(&out.stderr).contains("1 dead letter(s) refused"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(pending_messages(&client, &options).await, 2);

    // purge without --yes: refused, the foreign one still there; with it: gone.
    let out = run(&["purge"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        dead_letters::list(&store, &Filter::default(), 10)
            .await
            .unwrap()
            .0
            .len(),
        1
    );
    let purged = json(&run(&["purge", "--yes", "--json"]));
    assert_eq!(purged["purged"][0]["message_id"], f.message_id.to_string());
    assert!(dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap()
        .0
        .is_empty());
    let empty = text(&run(&["list"]).stdout);
    assert!(empty.contains("no dead letters match"), "{empty}");
}

/// A sequence counter behind its bucket's messages (restored from a backup): the slot a
/// redrive takes is occupied, so the transaction writes nothing, the dead letter stays,
/// and the error says why (exit 1).
#[tokio::test]
async fn a_redrive_into_a_bucket_whose_counter_is_behind_writes_nothing() {
    let client = dynamodb().await;
    let options = fresh_table(&client, 2).await;
    let store = DynamoDbOutboxStore::new(client.clone(), options.clone()).unwrap();
    let writer = DynamoDbOutboxWriter::new(client.clone(), options.clone()).unwrap();
    let m = writer.message("orders").with_partition(1).with_value("m");
    let seq = writer.enqueue(std::slice::from_ref(&m)).await.unwrap()[0].sequence;
    store.quarantine(1, seq).await.unwrap();
    // A message at the counter's next number, put straight into the table.
    let squatter = writer.message("orders").with_partition(1);
    let item =
        dynamo_outbox::protocol::schema::message_item(store.keys(), &squatter, 1, seq + 1).unwrap();
    client
        .put_item()
        .table_name(&options.table_name)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
    let out = outboxctl(&[
        "dead-letters",
        "redrive",
        "--table",
        &options.table_name,
        "--bucket-count",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("counter is behind its messages"),
        "{}",
        text(&out.stderr)
    );
    let (left, _) = dead_letters::list(&store, &Filter::default(), 10)
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "the dead letter stays");
    assert_eq!(
        pending_messages(&client, &options).await,
        1,
        "only the squatter"
    );
}

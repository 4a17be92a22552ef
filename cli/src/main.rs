//! `outboxctl`: the operator's command line for the DynamoDB outbox.

fn main() {
    println!("outboxctl");
}

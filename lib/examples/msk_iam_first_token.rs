//! Cold start to the first MSK IAM token: builds the relay's token provider with static
//! credentials on a current-thread tokio runtime (as the Lambda functions run), asks it for one
//! token, and prints the microseconds from `main` to the token (the process's own start,
//! exec and loading included, is measured from outside: see BENCHMARKS.md, "MSK IAM signer").
//!
//! `cargo run --release -p dynamo-outbox --example msk_iam_first_token`

use std::time::Instant;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use dynamo_outbox::publish::MskIamTokenProvider;

fn main() {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let token = runtime.block_on(async {
        let credentials = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            Some("session/token+value=".into()),
            None,
            "example",
        );
        let provider =
            MskIamTokenProvider::new("eu-west-1", SharedCredentialsProvider::new(credentials));
        provider.token().await.expect("a token")
    });
    let elapsed = started.elapsed();
    // the token's length only: a token is a credential
    println!(
        "first token ({} bytes) after {} us",
        token.len(),
        elapsed.as_micros()
    );
}

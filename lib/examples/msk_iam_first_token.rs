//! Cold start to the first MSK IAM token: builds the relay's token provider with static
//! credentials on a current-thread tokio runtime (as the Lambda functions run), asks it for one
//! token, and prints the microseconds from `main` to the token (the process's own start,
//! exec and loading included, is measured from outside: see BENCHMARKS.md, "MSK IAM signer").
//!
//! `cargo run --release -p dynamo-outbox --example msk_iam_first_token [-- --show-url]`
//!
//! `--show-url` also prints the token's URL (it is signed with the SigV4 suite's example keys,
//! no credential): run under `faketime '2025-12-01 00:00:00Z'` it shows the token the
//! signer's tests pin (AWS's own signer's, `AWS_VECTOR_URL` in `tests/msk_iam.rs`).

use std::time::Instant;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
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
    // the token's length only: a token is a credential (these keys are the examples')
    println!(
        "first token ({} bytes) after {} us",
        token.len(),
        elapsed.as_micros()
    );
    if std::env::args().any(|a| a == "--show-url") {
        let url = URL_SAFE_NO_PAD.decode(&token).expect("base64url token");
        println!("{}", String::from_utf8_lossy(&url));
    }
}

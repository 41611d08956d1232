//! `granary run --serve --tls`: TLS and authentication on every endpoint of a served run, with
//! real processes on 127.0.0.1 (the dispatcher, its worker process, trainers). A trainer with the
//! run's CA and trainer token reads every element exactly once; one without the token, or
//! dialling plaintext, is refused.

use granary_e2e::*;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_served_run_with_tls_serves_only_trainers_holding_its_token() {
    let data = dataset(48, 8, 12, 2);
    let journal = data.dir.path().join("journal");
    let d = start_dispatcher_with(&data.manifest, "127.0.0.1:0", &journal, &["--workers", "1", "--tls"]);
    let ca = d.ready["tls_ca"].as_str().expect("the ready line names the CA").to_string();
    let token_file = d.ready["token_file"].as_str().expect("the ready line names the trainer token");
    let token = std::fs::read_to_string(token_file).expect("the trainer token is readable");

    // No token: the dispatcher refuses the registration.
    let mut anonymous = start_consumer_env(&d.address, "e2e", &[], &[("GRANARY_TLS_CA", &ca)]);
    assert!(!anonymous.finish(LONG), "a trainer without the token consumed");
    assert!(anonymous.seen.is_empty());
    // The token without TLS: the TLS port does not speak plaintext.
    let mut plaintext = start_consumer_env(&d.address, "e2e", &[], &[("GRANARY_TOKEN", token.trim())]);
    assert!(!plaintext.finish(LONG), "a trainer dialling plaintext consumed");
    assert!(plaintext.seen.is_empty());

    // The legitimate trainer: every element of both epochs exactly once, over TLS.
    let env = [("GRANARY_TLS_CA", ca.as_str()), ("GRANARY_TOKEN", token.trim())];
    let mut trainer = start_consumer_env(&d.address, "e2e", &[], &env);
    assert!(trainer.finish(LONG), "the trainer with the token did not finish");
    assert_exactly_once(&trainer.seen, &data.keys, 2);
}

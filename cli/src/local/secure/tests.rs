//! The credentials of a secured run: private, loadable, and kept across runs with
//! `--credentials`.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn a_runs_credentials_are_private_and_load() {
    let credentials = Credentials::issue("p").unwrap();
    assert_eq!(mode(&credentials.trainer_token_file()), 0o600);
    let token = read(&credentials.trainer_token_file());
    let principal = credentials.key.check(&token).unwrap();
    assert_eq!((principal.role, principal.scope.as_str()), (Role::Trainer, "p"));
    assert!(credentials.dispatcher.has_identity());
    let dir = credentials.dir.path().to_path_buf();
    drop(credentials);
    assert!(!dir.exists(), "the folder goes with the run");
}

#[test]
fn kept_credentials_are_made_once_and_survive_a_restart() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("creds");
    let first = Credentials::make(Some(&dir), "p").unwrap();
    assert_eq!(mode(&dir), 0o700, "the folder is private");
    for file in [CA_KEY, MASTER_KEY, CA_CERT, "trainer.token", "worker.token", "worker/tls.key"] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
    let (token, ca) = (read(&first.trainer_token_file()), read(&first.ca_file()));
    drop(first);
    assert!(dir.join(MASTER_KEY).exists(), "a kept folder stays");

    // The next run reuses the CA and key: a trainer's token and CA still work.
    let second = Credentials::make(Some(&dir), "p").unwrap();
    assert_eq!(read(&second.trainer_token_file()), token);
    assert_eq!(read(&second.ca_file()), ca);
    assert_eq!(second.key.check(&token).unwrap().role, Role::Trainer);
    assert!(second.worker_args().iter().any(|a| a.starts_with(&dir.display().to_string())));
    // Another pipeline served with the same folder gets its own token under the same key.
    let other = Credentials::make(Some(&dir), "q").unwrap();
    assert_ne!(read(&other.trainer_token_file()), token);
    assert_eq!(other.key.check(&token).unwrap().scope, "p");
}

#[test]
fn a_partial_or_corrupt_folder_is_refused_naming_the_file_and_the_fix() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("creds");
    drop(Credentials::keep(&dir, "p").unwrap());
    std::fs::remove_file(dir.join(MASTER_KEY)).unwrap();
    let error = format!("{:#}", Credentials::keep(&dir, "p").err().unwrap());
    assert!(error.contains("but not master.key") && error.contains("empty the folder"), "{error}");

    write(&dir.join(MASTER_KEY), "not a key\n").unwrap();
    let error = format!("{:#}", Credentials::keep(&dir, "p").err().unwrap());
    assert!(error.contains(&dir.join(MASTER_KEY).display().to_string()), "{error}");
    assert!(error.contains("restore it"), "{error}");

    write(&dir.join(MASTER_KEY), &MasterKey::generate().unwrap().encode()).unwrap();
    write(&dir.join(CA_KEY), "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    let error = format!("{:#}", Credentials::keep(&dir, "p").err().unwrap());
    assert!(error.contains("ca.crt or ca.key"), "{error}");
}

#[test]
fn secrets_open_to_others_are_refused() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("creds");
    drop(Credentials::keep(&dir, "p").unwrap());
    std::fs::set_permissions(dir.join(MASTER_KEY), std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = format!("{:#}", Credentials::keep(&dir, "p").err().unwrap());
    assert!(error.contains("chmod 600"), "{error}");
    std::fs::set_permissions(dir.join(MASTER_KEY), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let error = format!("{:#}", Credentials::keep(&dir, "p").err().unwrap());
    assert!(error.contains("chmod 700"), "{error}");
    let file = parent.path().join("file");
    std::fs::write(&file, "").unwrap();
    let error = format!("{:#}", Credentials::keep(&file, "p").err().unwrap());
    assert!(error.contains("is not a folder"), "{error}");
}

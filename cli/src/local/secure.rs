//! `granary run --serve ADDR --tls`: the credentials of one secured local run. A fresh CA, a
//! master key, the dispatcher's and the workers' certificates (for `localhost` and 127.0.0.1),
//! the workers' token and the pipeline's trainer token, in a private folder that lives as long
//! as the run. The ready line names the CA and the trainer token, which a trainer passes as
//! `GRANARY_TLS_CA` and `GRANARY_TOKEN` (its contents).

use anyhow::Context;
use granary_security::token::ANY;
use granary_security::{Authority, MasterKey, Role, TlsFiles, TlsMaterial};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the run's certificates are valid: longer than any local run.
const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// The names the certificates serve: what local workers advertise and trainers dial.
const HOSTS: [&str; 2] = ["localhost", "127.0.0.1"];

/// One secured run's credentials.
pub struct Credentials {
    /// The folder holding them (removed when dropped).
    dir: tempfile::TempDir,
    /// The master key the dispatcher checks tokens with.
    pub key: MasterKey,
    /// The dispatcher's TLS material.
    pub dispatcher: TlsMaterial,
}

impl Credentials {
    /// Makes the credentials of a run serving `pipeline`.
    pub fn issue(pipeline: &str) -> anyhow::Result<Credentials> {
        let dir = tempfile::Builder::new()
            .prefix("granary-tls-")
            .tempdir()
            .context("cannot create the TLS folder")?;
        let ca = Authority::generate("granary run", VALIDITY).context("cannot make the run's CA")?;
        let key = MasterKey::generate().context("cannot make the run's master key")?;
        let dispatcher =
            ca.issue(Role::Owner, ANY, &HOSTS, VALIDITY).context("cannot certify the dispatcher")?;
        let worker =
            ca.issue(Role::Worker, pipeline, &HOSTS, VALIDITY).context("cannot certify the workers")?;
        write(&dir.path().join("ca.crt"), ca.cert_pem())?;
        let workers = dir.path().join("worker");
        std::fs::create_dir(&workers).context("cannot create the workers' TLS folder")?;
        write(&workers.join("ca.crt"), ca.cert_pem())?;
        write(&workers.join("tls.crt"), &worker.cert_pem)?;
        write(&workers.join("tls.key"), &worker.key_pem)?;
        write(&dir.path().join("worker.token"), &key.mint(Role::Worker, pipeline))?;
        write(&dir.path().join("trainer.token"), &key.mint(Role::Trainer, pipeline))?;
        let dispatcher =
            TlsMaterial::from_pem(ca.cert_pem(), Some((&dispatcher.cert_pem, &dispatcher.key_pem)));
        // The workers load their folder as `granary worker --tls-dir` does: check it now.
        TlsFiles::in_dir(&workers).load().context("the workers' TLS folder")?;
        Ok(Credentials { dir, key, dispatcher })
    }

    /// The CA certificate trainers check the dispatcher and the workers against.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The pipeline's trainer token.
    pub fn trainer_token_file(&self) -> PathBuf {
        self.dir.path().join("trainer.token")
    }

    /// `granary worker` flags that give a worker its TLS folder and token.
    pub fn worker_args(&self) -> Vec<String> {
        let path = |p: PathBuf| p.display().to_string();
        vec![
            "--tls-dir".into(),
            path(self.dir.path().join("worker")),
            "--token-file".into(),
            path(self.dir.path().join("worker.token")),
        ]
    }
}

/// Writes a secret readable by this user only.
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_credentials_are_private_and_load() {
        let credentials = Credentials::issue("p").unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(credentials.trainer_token_file()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = std::fs::read_to_string(credentials.trainer_token_file()).unwrap();
        let principal = credentials.key.check(&token).unwrap();
        assert_eq!((principal.role, principal.scope.as_str()), (Role::Trainer, "p"));
        assert!(credentials.dispatcher.has_identity());
        let dir = credentials.dir.path().to_path_buf();
        drop(credentials);
        assert!(!dir.exists(), "the folder goes with the run");
    }
}

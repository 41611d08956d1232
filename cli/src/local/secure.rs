//! `granary run --serve ADDR --tls`: the credentials of one secured local run. A CA, a master
//! key, the dispatcher's and the workers' certificates (for `localhost` and 127.0.0.1), the
//! workers' token and the pipeline's trainer token. By default they are fresh and lie in a
//! private folder that lives as long as the run; with `--credentials DIR` the CA and the master
//! key are kept in DIR and reused by later runs, so a trainer's token and CA survive a restart.
//! The ready line names the CA and the trainer token, which a trainer passes as
//! `GRANARY_TLS_CA` and `GRANARY_TOKEN` (its contents).

use anyhow::{Context, bail};
use granary_security::token::ANY;
use granary_security::{Authority, MasterKey, Role, TlsFiles, TlsMaterial};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the certificates a run issues are valid: longer than any local run.
const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a kept CA is valid: the folder is meant to outlive many runs.
const KEPT_CA_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// The names the certificates serve: what local workers advertise and trainers dial.
const HOSTS: [&str; 2] = ["localhost", "127.0.0.1"];
/// The files of a kept folder that later runs reuse; together they are the run's identity.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const MASTER_KEY: &str = "master.key";

/// Where a run's credentials lie.
enum Folder {
    /// A private temporary folder, removed with the run.
    Temporary(tempfile::TempDir),
    /// A folder given with `--credentials`, kept.
    Kept(PathBuf),
}

impl Folder {
    fn path(&self) -> &Path {
        match self {
            Folder::Temporary(dir) => dir.path(),
            Folder::Kept(dir) => dir,
        }
    }
}

/// One secured run's credentials.
pub struct Credentials {
    /// The folder holding them.
    dir: Folder,
    /// The master key the dispatcher checks tokens with.
    pub key: MasterKey,
    /// The dispatcher's TLS material.
    pub dispatcher: TlsMaterial,
}

impl Credentials {
    /// The credentials of a run serving `pipeline`: kept in `kept` when given (see
    /// [`Credentials::keep`]), else fresh ones in a temporary folder ([`Credentials::issue`]).
    pub fn make(kept: Option<&Path>, pipeline: &str) -> anyhow::Result<Credentials> {
        match kept {
            Some(dir) => Credentials::keep(dir, pipeline),
            None => Credentials::issue(pipeline),
        }
    }

    /// Makes fresh credentials for a run serving `pipeline`, in a folder removed with them.
    pub fn issue(pipeline: &str) -> anyhow::Result<Credentials> {
        let dir = tempfile::Builder::new()
            .prefix("granary-tls-")
            .tempdir()
            .context("cannot create the TLS folder")?;
        let ca = Authority::generate("granary run", VALIDITY).context("cannot make the run's CA")?;
        let key = MasterKey::generate().context("cannot make the run's master key")?;
        write(&dir.path().join(CA_CERT), ca.cert_pem())?;
        Credentials::complete(Folder::Temporary(dir), &ca, key, pipeline)
    }

    /// The credentials kept in `dir` for a run serving `pipeline`: the CA (`ca.crt`, `ca.key`)
    /// and master key (`master.key`) found there, or new ones written there when it holds none
    /// (the folder is created private, 0700, and every file 0600). The certificates and tokens
    /// are written again each run; the tokens are the same for the same key and pipeline.
    pub fn keep(dir: &Path, pipeline: &str) -> anyhow::Result<Credentials> {
        private_folder(dir)?;
        let (ca, key) = kept_root(dir)?;
        Credentials::complete(Folder::Kept(dir.to_path_buf()), &ca, key, pipeline)
    }

    /// Issues the certificates and tokens of a run whose CA is `ca` and key `key` into `dir`,
    /// which already holds the CA's certificate.
    fn complete(dir: Folder, ca: &Authority, key: MasterKey, pipeline: &str) -> anyhow::Result<Credentials> {
        let dispatcher =
            ca.issue(Role::Owner, ANY, &HOSTS, VALIDITY).context("cannot certify the dispatcher")?;
        let worker =
            ca.issue(Role::Worker, pipeline, &HOSTS, VALIDITY).context("cannot certify the workers")?;
        let root = dir.path();
        let workers = root.join("worker");
        private_folder(&workers)?;
        write(&workers.join("ca.crt"), ca.cert_pem())?;
        write(&workers.join("tls.crt"), &worker.cert_pem)?;
        write(&workers.join("tls.key"), &worker.key_pem)?;
        write(&root.join("worker.token"), &key.mint(Role::Worker, pipeline))?;
        write(&root.join("trainer.token"), &key.mint(Role::Trainer, pipeline))?;
        let dispatcher =
            TlsMaterial::from_pem(ca.cert_pem(), Some((&dispatcher.cert_pem, &dispatcher.key_pem)));
        // The workers load their folder as `granary worker --tls-dir` does: check it now.
        TlsFiles::in_dir(&workers).load().context("the workers' TLS folder")?;
        Ok(Credentials { dir, key, dispatcher })
    }

    /// The CA certificate trainers check the dispatcher and the workers against.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join(CA_CERT)
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

/// Creates `dir` readable by this user only, or checks that an existing one is.
fn private_folder(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        return std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create the credentials folder {}", dir.display()));
    }
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("--credentials {} is not a folder: name a folder (it is created when missing)", dir.display());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the credentials folder {} is open to other users (mode {mode:o}): run `chmod 700 {}`",
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The CA and master key kept in `dir`, made and written there when it holds none of them.
fn kept_root(dir: &Path) -> anyhow::Result<(Authority, MasterKey)> {
    let files = [CA_CERT, CA_KEY, MASTER_KEY];
    let (present, missing): (Vec<&str>, Vec<&str>) = files.iter().partition(|f| dir.join(f).exists());
    if present.is_empty() {
        let ca = Authority::generate("granary run", KEPT_CA_VALIDITY).context("cannot make the run's CA")?;
        let key = MasterKey::generate().context("cannot make the run's master key")?;
        write(&dir.join(CA_KEY), &ca.key_pem())?;
        write(&dir.join(MASTER_KEY), &format!("{}\n", key.encode()))?;
        write(&dir.join(CA_CERT), ca.cert_pem())?;
        return Ok((ca, key));
    }
    if !missing.is_empty() {
        bail!(
            "the credentials folder {} holds {} but not {}: restore the missing file from where the \
             folder was copied, or empty the folder to make new credentials (the tokens and CA \
             trainers hold then stop working)",
            dir.display(),
            present.join(", "),
            missing.join(", ")
        );
    }
    for secret in [CA_KEY, MASTER_KEY] {
        private_file(&dir.join(secret))?;
    }
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let corrupt = |name: &str| {
        format!(
            "{} is not what `granary run --credentials` wrote: restore it, or empty the folder to \
             make new credentials",
            dir.join(name).display()
        )
    };
    let key = MasterKey::decode(&read(MASTER_KEY)?).with_context(|| corrupt(MASTER_KEY))?;
    let ca = Authority::from_pem(&read(CA_CERT)?, &read(CA_KEY)?)
        .with_context(|| corrupt(&format!("{CA_CERT} or {CA_KEY}")))?;
    Ok((ca, key))
}

/// Checks that the secret `path` is readable by this user only.
fn private_file(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is readable by other users (mode {:o}): run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

/// Writes a secret readable by this user only, replacing what `path` held: through a new file
/// beside it, renamed over it, so that a reader never sees half a file.
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    // Left over from a run that stopped while writing.
    let _ = std::fs::remove_file(&staged);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staged)
        .with_context(|| format!("cannot create {}", staged.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", staged.display()))?;
    std::fs::rename(&staged, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests;

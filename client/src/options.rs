//! What a client connects to and which consumer of which job it is.

use std::ffi::OsString;
use std::path::Path;

use crate::error::ClientError;
use crate::mode::Mode;
use crate::position::Position;

/// Environment variable that names the dispatcher when no address is given.
pub const DISPATCHER_ENV: &str = "GRANARY_DISPATCHER";

/// Environment variable naming the CA certificate (PEM) that the dispatcher's and workers'
/// certificates chain to: set, the client dials them over TLS.
pub const TLS_CA_ENV: &str = "GRANARY_TLS_CA";

/// Environment variable naming a file that holds the trainer token (on Kubernetes, the
/// pipeline's token Secret mounted as a file). It and `GRANARY_TOKEN` exclude each other.
pub const TOKEN_FILE_ENV: &str = "GRANARY_TOKEN_FILE";

/// Options for [`crate::Client::open`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Dispatcher address, `host:port` or `http://host:port`; `None` reads `$GRANARY_DISPATCHER`.
    pub dispatcher: Option<String>,
    /// The pipeline to read: `metadata.name` locally, `namespace/name` under Kubernetes.
    pub pipeline: String,
    /// Job name; `None` means the pipeline's name.
    pub job: Option<String>,
    /// How the job's consumers share an epoch. Taken from the position when resuming.
    pub mode: Mode,
    /// This consumer's index; `None` takes the lowest free one.
    pub consumer_index: Option<u32>,
    /// Consumers of the job (fixed by its first consumer). Taken from the position when resuming.
    pub num_consumers: u32,
    /// Resume from a checkpoint taken with [`crate::Client::checkpoint`].
    pub resume: Option<Position>,
    /// The pipeline's trainer token (from its Secret; [`ClientOptions::token_from_file`] reads
    /// one from a file). `None` reads the file named by `$GRANARY_TOKEN_FILE`, else
    /// `$GRANARY_TOKEN`, and without either the client sends none (a dispatcher without
    /// authentication).
    pub token: Option<String>,
    /// TLS to the dispatcher and the workers: the CA their certificates chain to (and a client
    /// certificate, if the trainer has one; [`ClientOptions::tls_from_ca`] reads a CA file).
    /// `None` reads the CA from `$GRANARY_TLS_CA`, and without either the client dials plaintext.
    pub tls: Option<granary_security::TlsMaterial>,
    /// Where the images of the pipeline's fused image run are made (placement). `None` reads
    /// `$GRANARY_IMAGES` (`auto`, `client` or `workers`), and without it: [`ImagePlacement::Auto`].
    pub images: Option<ImagePlacement>,
    /// Memory the client may hold in complete batches ahead of the trainer. It holds 4 at
    /// first, and doubles that whenever the trainer empties a full buffer (the workers' pace
    /// comes in bursts), as long as that many of the largest batch so far fit in this budget,
    /// up to 64 batches; never fewer than 4. 0 keeps 4. Default:
    /// [`crate::DEFAULT_PREFETCH_BYTES`] (1 GiB).
    pub prefetch_bytes: u64,
}

/// Environment variable read when [`ClientOptions::images`] is `None`.
pub const IMAGES_ENV: &str = "GRANARY_IMAGES";

/// Where the images of a pipeline's fused image run (decode, crop or resize, flip) are made.
/// Either way the pixels are the same bytes: this host executes the plans the workers make,
/// with the workers' own code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ImagePlacement {
    /// The dispatcher moves a share of them to this host while it has idle cores, and back to
    /// the workers when it has none.
    #[default]
    Auto,
    /// All of them on this host.
    Client,
    /// All of them on the workers.
    Workers,
}

impl ImagePlacement {
    /// Reads `auto`, `client` or `workers`.
    pub fn parse(value: &str) -> Result<ImagePlacement, ClientError> {
        match value.trim() {
            "auto" => Ok(ImagePlacement::Auto),
            "client" => Ok(ImagePlacement::Client),
            "workers" => Ok(ImagePlacement::Workers),
            other => Err(ClientError::InvalidOptions(format!(
                "images: `{other}` is not a placement; use `auto`, `client` or `workers`"
            ))),
        }
    }

    /// What the registration asks for.
    pub(crate) fn to_proto(self) -> granary_proto::v1::ImagePlans {
        match self {
            ImagePlacement::Auto => granary_proto::v1::ImagePlans::Auto,
            ImagePlacement::Client => granary_proto::v1::ImagePlans::Always,
            ImagePlacement::Workers => granary_proto::v1::ImagePlans::Never,
        }
    }
}

impl ClientOptions {
    /// Options for a single distributed consumer of `pipeline`, dispatcher from the environment.
    pub fn new(pipeline: impl Into<String>) -> ClientOptions {
        ClientOptions {
            dispatcher: None,
            pipeline: pipeline.into(),
            job: None,
            mode: Mode::Distributed,
            consumer_index: None,
            num_consumers: 1,
            resume: None,
            token: None,
            tls: None,
            images: None,
            prefetch_bytes: crate::DEFAULT_PREFETCH_BYTES,
        }
    }

    /// Where the images are made: the option, else `$GRANARY_IMAGES`, else
    /// [`ImagePlacement::Auto`].
    pub fn images(&self) -> Result<ImagePlacement, ClientError> {
        if let Some(images) = self.images {
            return Ok(images);
        }
        match std::env::var(IMAGES_ENV) {
            Ok(value) if !value.trim().is_empty() => ImagePlacement::parse(&value)
                .map_err(|e| ClientError::InvalidOptions(format!("{IMAGES_ENV}: {}", unprefixed(&e)))),
            _ => Ok(ImagePlacement::Auto),
        }
    }

    /// The token to send: the option, else the file named by `$GRANARY_TOKEN_FILE`, else
    /// `$GRANARY_TOKEN`. Both variables set is an error: which one is meant is unclear.
    pub fn token(&self) -> Result<Option<String>, ClientError> {
        match &self.token {
            Some(token) => Ok(Some(token.trim().to_owned()).filter(|t| !t.is_empty())),
            None => token_from_env(
                std::env::var_os(TOKEN_FILE_ENV),
                std::env::var_os(granary_security::TOKEN_ENV),
            ),
        }
    }

    /// The trainer token held in the file at `path` (a mounted Secret's key, or the
    /// `token_file` a served run names), trimmed; an error naming the path when it cannot be
    /// read or is empty.
    pub fn token_from_file(path: &Path) -> Result<String, ClientError> {
        let token = granary_security::read_token(Some(path))
            .map_err(|e| ClientError::InvalidOptions(e.to_string()))?
            .unwrap_or_default();
        if token.is_empty() {
            return Err(ClientError::InvalidOptions(format!(
                "the token file `{}` is empty; it should hold the pipeline's trainer token",
                path.display()
            )));
        }
        Ok(token)
    }

    /// TLS settings trusting the CA certificate (PEM) at `path`, without a client certificate;
    /// an error naming the path when it cannot be read or holds no PEM certificate.
    pub fn tls_from_ca(path: &Path) -> Result<granary_security::TlsMaterial, ClientError> {
        let files = granary_security::TlsFiles { ca: path.to_path_buf(), cert: None, key: None };
        files.load().map_err(|e| ClientError::InvalidOptions(e.to_string()))
    }

    /// The TLS settings to dial with: the option, else the CA named by `$GRANARY_TLS_CA`.
    pub fn tls(&self) -> Result<Option<granary_security::TlsMaterial>, ClientError> {
        if let Some(tls) = &self.tls {
            return Ok(Some(tls.clone()));
        }
        let Some(ca) = std::env::var_os(TLS_CA_ENV).filter(|v| !v.is_empty()) else { return Ok(None) };
        ClientOptions::tls_from_ca(Path::new(&ca))
            .map(Some)
            .map_err(|e| ClientError::InvalidOptions(format!("{TLS_CA_ENV}: {}", unprefixed(&e))))
    }

    /// The dispatcher address to use: the option, else `$GRANARY_DISPATCHER`.
    pub fn dispatcher_address(&self) -> Result<String, ClientError> {
        if let Some(address) = self.dispatcher.as_deref().map(str::trim)
            && !address.is_empty()
        {
            return Ok(address.to_owned());
        }
        match std::env::var(DISPATCHER_ENV) {
            Ok(address) if !address.trim().is_empty() => Ok(address.trim().to_owned()),
            _ => Err(ClientError::NoDispatcher),
        }
    }
}

/// The token the environment gives: `file` is `$GRANARY_TOKEN_FILE`, `value` `$GRANARY_TOKEN`
/// (empty counts as unset).
fn token_from_env(file: Option<OsString>, value: Option<OsString>) -> Result<Option<String>, ClientError> {
    let file = file.filter(|f| !f.is_empty());
    let value = value.map(|v| v.to_string_lossy().trim().to_owned()).filter(|v| !v.is_empty());
    match (file, value) {
        (Some(_), Some(_)) => Err(ClientError::InvalidOptions(format!(
            "both {TOKEN_FILE_ENV} and {} are set; unset one of them",
            granary_security::TOKEN_ENV
        ))),
        (Some(file), None) => ClientOptions::token_from_file(Path::new(&file))
            .map(Some)
            .map_err(|e| ClientError::InvalidOptions(format!("{TOKEN_FILE_ENV}: {}", unprefixed(&e)))),
        (None, value) => Ok(value),
    }
}

/// An options error's text without the `invalid client options: ` its display starts with.
fn unprefixed(error: &ClientError) -> String {
    match error {
        ClientError::InvalidOptions(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A file under the system's temporary folder, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!("granary-options-{}-{name}", std::process::id()));
            std::fs::write(&path, contents).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn message(result: Result<impl std::fmt::Debug, ClientError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn a_token_file_is_read_and_trimmed() {
        let file = TempFile::new("token", "gr1.trainer.abc\n");
        assert_eq!(ClientOptions::token_from_file(&file.0).unwrap(), "gr1.trainer.abc");
        let env = token_from_env(Some(file.0.clone().into()), None).unwrap();
        assert_eq!(env.as_deref(), Some("gr1.trainer.abc"));
    }

    #[test]
    fn a_missing_or_empty_token_file_is_an_error_naming_it() {
        let missing = std::env::temp_dir().join("granary-options-no-such-token");
        let error = message(ClientOptions::token_from_file(&missing));
        assert!(error.contains("granary-options-no-such-token"), "{error}");
        let error = message(token_from_env(Some(missing.into()), None));
        assert!(error.contains(TOKEN_FILE_ENV) && error.contains("no-such-token"), "{error}");
        let empty = TempFile::new("empty-token", " \n");
        let error = message(ClientOptions::token_from_file(&empty.0));
        assert!(error.contains("is empty") && error.contains("empty-token"), "{error}");
    }

    #[test]
    fn the_token_variable_is_used_alone_and_refused_beside_a_token_file() {
        assert_eq!(token_from_env(None, Some(" tok \n".into())).unwrap().as_deref(), Some("tok"));
        assert_eq!(token_from_env(Some("".into()), Some("".into())).unwrap(), None);
        assert_eq!(token_from_env(None, None).unwrap(), None);
        let file = TempFile::new("both", "from-file");
        let error = message(token_from_env(Some(file.0.clone().into()), Some("tok".into())));
        assert!(error.contains(TOKEN_FILE_ENV) && error.contains("GRANARY_TOKEN "), "{error}");
    }

    #[test]
    fn an_explicit_token_wins_and_an_empty_one_sends_none() {
        let mut options = ClientOptions::new("p");
        options.token = Some(" explicit\n".into());
        assert_eq!(options.token().unwrap().as_deref(), Some("explicit"));
        options.token = Some(" ".into());
        assert_eq!(options.token().unwrap(), None);
    }

    #[test]
    fn a_ca_file_must_be_readable_pem() {
        let missing = std::env::temp_dir().join("granary-options-no-such-ca.crt");
        let error = message(ClientOptions::tls_from_ca(&missing));
        assert!(error.contains("the CA certificate") && error.contains("no-such-ca.crt"), "{error}");
        let not_pem = TempFile::new("ca.crt", "not a certificate");
        let error = message(ClientOptions::tls_from_ca(&not_pem.0));
        assert!(error.contains("no PEM") && error.contains("ca.crt"), "{error}");
        let pem =
            TempFile::new("real-ca.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        assert!(!ClientOptions::tls_from_ca(&pem.0).unwrap().has_identity());
    }
}

//! The client side of bearer tokens: a tonic interceptor that adds `authorization: Bearer
//! <token>` to every request, and reading a token from a file or the environment.

use crate::principal::AUTHORIZATION;
use std::path::Path;
use tonic::metadata::AsciiMetadataValue;

/// The environment variable clients and workers read their token from.
pub const TOKEN_ENV: &str = "GRANARY_TOKEN";

/// Why a token could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BearerError {
    /// The token file could not be read.
    #[error("cannot read the token file `{path}`: {source}")]
    Read {
        /// Its path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token has characters a header cannot carry.
    #[error("the token is not printable ASCII; use the token as the dispatcher issued it")]
    NotAscii,
}

/// Adds the token, when there is one, to each request.
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Bearer {
    /// An interceptor sending `token` (`None`: sends nothing, for a dispatcher without
    /// authentication).
    pub fn new(token: Option<&str>) -> Result<Bearer, BearerError> {
        let value = token
            .map(|t| {
                format!("Bearer {}", t.trim())
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| BearerError::NotAscii)
            })
            .transpose()?;
        Ok(Bearer(value))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// The token in `file` when one is given, else in [`TOKEN_ENV`], else none.
pub fn read_token(file: Option<&Path>) -> Result<Option<String>, BearerError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|source| BearerError::Read { path: path.to_path_buf(), source })?;
        return Ok(Some(text.trim().to_string()));
    }
    Ok(std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn the_token_goes_in_the_authorization_header() {
        let mut bearer = Bearer::new(Some("gr1.trainer.YQ.abc\n")).unwrap();
        let request = bearer.call(tonic::Request::new(())).unwrap();
        assert_eq!(request.metadata().get(AUTHORIZATION).unwrap(), "Bearer gr1.trainer.YQ.abc");
        let request = Bearer::default().call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get(AUTHORIZATION).is_none());
        assert!(Bearer::new(Some("bad\u{7f}")).is_err());
    }

    #[test]
    fn a_token_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "gr1.x.y.z\n").unwrap();
        assert_eq!(read_token(Some(&path)).unwrap().as_deref(), Some("gr1.x.y.z"));
        let missing = read_token(Some(&dir.path().join("none"))).unwrap_err().to_string();
        assert!(missing.contains("cannot read the token file"), "{missing}");
    }
}

//! Object-store URLs: the schemes Granary reads and writes, and the checks a URL in a spec gets.

use crate::problem::Problem;

/// URL schemes Granary can read and write.
pub const SUPPORTED_SCHEMES: &[&str] = &["file", "s3", "gs", "az", "azure", "abfs", "abfss", "memory"];

const URL_FORMS: &str = "file:///absolute/path/, s3://bucket/prefix/, gs://bucket/prefix/, \
     az://container/prefix/ or memory:///prefix/ (in a manifest file, also file:relative/path/)";

/// Checks an object-store URL at `path`: it parses, its scheme is supported, and it names a
/// bucket (or container, or host) where the scheme needs one. Problems go to `problems`.
pub fn check_url(url: &str, path: &str, problems: &mut Vec<Problem>) {
    let mut bad = |message: String| problems.push(Problem::new(path, message));
    if url.trim().is_empty() {
        bad(format!("must not be empty; give an object-store URL: {URL_FORMS}"));
        return;
    }
    if url.trim() != url {
        bad(format!("`{url}` has spaces around it; remove them"));
        return;
    }
    if url.starts_with("//") || !has_scheme(url) {
        bad(format!("`{url}` has no scheme; write {URL_FORMS}"));
        return;
    }
    if let Some(rest) = url.strip_prefix("file:")
        && !rest.starts_with('/')
    {
        bad(format!(
            "`{url}` is a relative file: URL, which resolves only in a manifest read by `granary`; \
             write an absolute file:///path/ URL"
        ));
        return;
    }
    let parsed = match url::Url::parse(url) {
        Ok(u) => u,
        Err(e) => {
            bad(format!("`{url}` is not a valid URL ({e}); write {URL_FORMS}"));
            return;
        }
    };
    let scheme = parsed.scheme();
    if !SUPPORTED_SCHEMES.contains(&scheme) {
        let hint = match scheme {
            "http" | "https" => "; for S3-compatible servers use s3://bucket/ with AWS_ENDPOINT set",
            "gcs" => "; Google Cloud Storage is gs://bucket/",
            "s3a" | "s3n" => "; write s3://bucket/",
            _ => "",
        };
        bad(format!(
            "scheme `{scheme}:` is not supported{hint}; use one of {}",
            SUPPORTED_SCHEMES.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(", ")
        ));
        return;
    }
    let host = parsed.host_str().unwrap_or("");
    match scheme {
        "s3" | "gs" if host.is_empty() => {
            bad(format!("`{url}` names no bucket; write {scheme}://BUCKET/prefix/"));
        }
        "az" | "azure" | "abfs" | "abfss" if host.is_empty() => {
            bad(format!("`{url}` names no container; write {scheme}://CONTAINER/prefix/"));
        }
        "file" if !host.is_empty() && host != "localhost" => {
            let tail = parsed.path().trim_start_matches('/');
            bad(format!(
                "a file: URL takes no host, but `{host}` is in the host position; write \
                 file:///{host}/{tail} for an absolute path or file:{host}/{tail} for a path relative \
                 to the manifest"
            ));
        }
        _ => {}
    }
}

/// Whether `text` starts with a URL scheme (`s3:`, `file:`, `c:`).
pub(crate) fn has_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once(':') else { return false };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

//! The one text of an error and its causes, each said once.
//!
//! Error types often put their source's message in their own (`object_store`'s
//! `Generic S3 error: {source}`, tonic's transport errors, ours before this module), and a report
//! that walks the chain then repeats every clause. [`error_text`] walks the chain and adds only
//! the causes whose text is not already said. It is the text of a gRPC status message that carries
//! an error, and the text the `granary` command and the Python client print.

use std::error::Error;

/// The text of `error` followed by each cause in its chain that adds something: a cause whose
/// text is already part of what was written is left out, and a cause whose text holds everything
/// written so far replaces it. Causes are joined with `: `.
pub fn error_text(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string().trim().to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        let said = said.trim();
        if said.is_empty() || text.contains(said) {
            // Already said (or nothing to say).
        } else if said.contains(text.as_str()) {
            text = said.to_string();
        } else {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    /// A test error with a message and an optional cause.
    #[derive(Debug)]
    struct E(String, Option<Box<E>>);

    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl Error for E {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    fn chain(texts: &[&str]) -> E {
        texts.iter().rev().fold(None, |cause, t| Some(E(t.to_string(), cause.map(Box::new)))).unwrap()
    }

    #[test]
    fn says_each_cause_once() {
        // Each level embeds its source, as object_store's errors do.
        let e = chain(&[
            "cannot open `s3://b/`: Generic S3 error: request failed: connection refused",
            "Generic S3 error: request failed: connection refused",
            "request failed: connection refused",
            "connection refused",
        ]);
        assert_eq!(
            error_text(&e),
            "cannot open `s3://b/`: Generic S3 error: request failed: connection refused"
        );
    }

    #[test]
    fn adds_causes_not_yet_said() {
        let e = chain(&["error sending request", "client error (Connect)", "tcp connect error", "refused"]);
        assert_eq!(
            error_text(&e),
            "error sending request: client error (Connect): tcp connect error: refused"
        );
    }

    #[test]
    fn a_cause_that_says_more_replaces_the_text() {
        let e = chain(&["transport error", "transport error: refused"]);
        assert_eq!(error_text(&e), "transport error: refused");
    }
}

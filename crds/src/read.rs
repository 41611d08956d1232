//! Reading a manifest's text from a file, with errors that name the file and the fix.

use crate::Problem;
use std::io::ErrorKind;
use std::path::Path;

/// The text of the manifest at `path`. A failure is one [`Problem`] at the file's path: a missing
/// file, one that cannot be read, or text that is not UTF-8 (with the offset of the first bad
/// byte).
pub fn read_manifest_text(path: &Path) -> Result<String, Problem> {
    let at = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| {
        let message = match e.kind() {
            ErrorKind::NotFound => "no such file; check the path".to_string(),
            ErrorKind::PermissionDenied => "permission denied; check the file's permissions".to_string(),
            ErrorKind::IsADirectory => "is a folder; name a manifest file".to_string(),
            _ => format!("cannot read the manifest ({e})"),
        };
        Problem::new(at(), message)
    })?;
    manifest_text(bytes).map_err(|message| Problem::new(at(), message))
}

/// `bytes` as text, or what is wrong with them.
pub fn manifest_text(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "is not UTF-8 text (byte {} is not valid UTF-8); save the manifest as UTF-8",
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_problem_and_the_fix() {
        let missing = read_manifest_text(Path::new("/nonexistent/p.yaml")).unwrap_err();
        assert_eq!(missing.path, "/nonexistent/p.yaml");
        assert!(missing.message.contains("no such file"), "{missing}");
        let latin1 = manifest_text(b"name: caf\xe9\n".to_vec()).unwrap_err();
        assert!(latin1.contains("byte 9") && latin1.contains("UTF-8"), "{latin1}");
    }
}

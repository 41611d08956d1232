//! Durability of a journal on a local file system. An object store acknowledges a PUT once the
//! object is durable; `object_store`'s local file system does not flush, so a record it wrote can
//! be lost, or left empty, by a power cut or a kernel crash after the dispatcher acknowledged the
//! request. Each object the journal creates there is flushed, with the folder that names it,
//! before the write counts as done.

use object_store::path::Path as StorePath;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The folder a local journal lives in: the files of its objects are under it.
#[derive(Clone, Debug)]
pub(super) struct LocalFolder {
    /// The journal's folder on the file system.
    pub(super) folder: PathBuf,
}

impl LocalFolder {
    /// The file of `location`, an object under `root` (the journal's object path): `None` when
    /// it is not under it.
    fn file(&self, root: &StorePath, location: &StorePath) -> Option<PathBuf> {
        let parts = location.prefix_match(root)?;
        let mut file = self.folder.clone();
        for part in parts {
            file.push(part.as_ref());
        }
        Some(file)
    }

    /// Flushes `location`'s data and the folder entry that names it to the disk.
    pub(super) async fn sync(&self, root: &StorePath, location: &StorePath) -> std::io::Result<()> {
        let Some(file) = self.file(root, location) else {
            return Err(std::io::Error::other(format!("`{location}` is not under the journal's `{root}`")));
        };
        tokio::task::spawn_blocking(move || sync_file(&file))
            .await
            .map_err(|e| std::io::Error::other(format!("the flush did not run: {e}")))?
    }
}

/// Flushes `file` and its parent folder (where the new name is recorded).
fn sync_file(file: &Path) -> std::io::Result<()> {
    File::open(file)?.sync_all()?;
    match file.parent() {
        Some(folder) => File::open(folder)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_created_object_is_flushed_by_its_file_and_one_outside_the_journal_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let local = LocalFolder { folder: dir.path().join("journal") };
        std::fs::create_dir_all(local.folder.join("records")).expect("folder");
        std::fs::write(local.folder.join("records").join("0001.json"), b"[]").expect("record");
        let root = StorePath::from("some/where/journal");
        let record = StorePath::from("some/where/journal/records/0001.json");
        local.sync(&root, &record).await.expect("flushed");
        let missing = StorePath::from("some/where/journal/records/0002.json");
        assert_eq!(
            local.sync(&root, &missing).await.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        );
        let outside = StorePath::from("else/records/0001.json");
        let refused = local.sync(&root, &outside).await.expect_err("not under the journal");
        assert!(refused.to_string().contains("not under the journal"), "{refused}");
    }
}

//! The shared memory between the worker and one Python runner: an anonymous memory file
//! (`memfd`) both processes map. Either side may grow it; the other remaps to the new size.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use memmap2::MmapMut;

/// The worker's side of one shared-memory file.
pub struct Shared {
    file: File,
    map: Option<MmapMut>,
}

impl Shared {
    /// A new, empty shared-memory file, closed on exec (the runner gets a duplicate).
    pub fn new() -> io::Result<Shared> {
        let name = c"granary-python";
        // SAFETY: memfd_create reads a NUL-terminated name and returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Shared { file, map: None })
    }

    /// The descriptor to hand the runner.
    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Current size in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Grows the file to at least `bytes` (in whole MiB, at least doubling) and maps it.
    pub fn reserve(&mut self, bytes: usize) -> io::Result<()> {
        if bytes <= self.len() {
            return Ok(());
        }
        let size = bytes.max(self.len() * 2).max(1 << 20).next_multiple_of(1 << 20);
        self.file.set_len(size as u64)?;
        self.remap(size)
    }

    /// Maps the file again at `size` bytes, after the runner grew it (it never shrinks: a size
    /// already mapped needs nothing).
    pub fn remap(&mut self, size: usize) -> io::Result<()> {
        if size <= self.len() {
            return Ok(());
        }
        let actual = self.file.metadata()?.len() as usize;
        if actual < size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the runner said the shared memory has {size} bytes, but it has {actual}"),
            ));
        }
        self.map = None;
        // SAFETY: the mapping is of a memory file only this worker and its runner use, and the
        // runner writes to it only while the worker waits for its reply; every read of the map
        // is bounds-checked against `len()`.
        self.map = Some(unsafe { MmapMut::map_mut(&self.file)? });
        Ok(())
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The mapped bytes, to write the inputs of a call.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }
}

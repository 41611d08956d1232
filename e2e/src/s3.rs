//! A real S3-compatible server for the tests: `s3s-fs` (installed by `scripts/test` with
//! `cargo install s3s-fs --version 0.14.1 --features binary`) on 127.0.0.1, over a temporary
//! folder, and the environment that points `object_store`'s S3 client at it.

use super::Proc;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ACCESS_KEY: &str = "granary-test";
const SECRET_KEY: &str = "granary-test-secret";

/// A running `s3s-fs`.
pub struct S3Server {
    /// The process (killed on drop).
    pub proc: Proc,
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Folder holding the buckets (one subfolder each).
    pub root: PathBuf,
}

/// The `s3s-fs` binary: on `PATH` or in `~/.cargo/bin`.
pub fn s3s_fs_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file());
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|d| d.join("bin/s3s-fs"));
    on_path.or(home.filter(|p| p.is_file())).unwrap_or_else(|| {
        panic!("s3s-fs is not installed: run scripts/test, or cargo install s3s-fs --version 0.14.1 --features binary")
    })
}

impl S3Server {
    /// Starts a server over `root` with the buckets `buckets`, on `port` (0: a free one).
    pub fn start(root: &Path, port: u16, buckets: &[&str]) -> S3Server {
        for b in buckets {
            std::fs::create_dir_all(root.join(b)).expect("bucket folder");
        }
        let port = if port == 0 { crate::free_port() } else { port };
        let child = Command::new(s3s_fs_bin())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs starts");
        let proc = Proc { child };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "s3s-fs did not listen on {port} within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        S3Server { proc, port, root: root.to_path_buf() }
    }

    /// The variables that point `object_store`'s S3 client at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Stops the server at once (SIGKILL): the store goes away.
    pub fn kill(mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
    }
}

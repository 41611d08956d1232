//! The panic hook of targets whose code contains third-party decoders' panics.

/// For a libFuzzer binary, before the first input: a panic raised in a dependency's source
/// unwinds quietly, so that what is fuzzed is the worker's containment of its third-party
/// decoders (the `image` crate's pure-Rust decoders and the parquet crate panic on some
/// malformed files, and the worker turns such a panic into the file's error, as it must in
/// production); every other panic goes on to the hook installed before, libfuzzer-sys's, which
/// aborts before unwinding. A dependency's panic that nothing contains still reaches
/// libfuzzer-sys's `catch_unwind` around the target, which aborts too: it is still a crash.
pub fn unwind_dependency_panics() {
    let aborting = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.location().is_some_and(|at| is_dependency_source(at.file())) {
            aborting(info);
        }
    }));
}

/// Whether `file` is in a dependency's source, where cargo unpacks them: crates.io's registry
/// or a git checkout.
fn is_dependency_source(file: &str) -> bool {
    file.contains("/registry/src/") || file.contains("/git/checkouts/")
}

#[cfg(test)]
mod tests {
    use super::is_dependency_source;

    #[test]
    fn dependency_sources_are_told_from_ours() {
        assert!(is_dependency_source(
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/image-webp-0.2.4/src/huffman.rs"
        ));
        assert!(is_dependency_source("/home/u/.cargo/git/checkouts/foo-1a2b/3c4d/src/lib.rs"));
        assert!(!is_dependency_source("worker/src/ops/image/decode.rs"));
        assert!(!is_dependency_source("/work/granary/worker/src/source/parquet.rs"));
    }
}

//! `CacheStore::open` reads `GRANARY_TEST_CACHE_THROTTLE`. This binary holds a single test, so
//! that changing the environment cannot race with other tests.

use std::time::Instant;

use granary_store::cache::{CacheError, CacheStore, THROTTLE_ENV};

#[tokio::test]
async fn open_applies_and_validates_the_throttle_variable() {
    // SAFETY: this test binary runs this one test; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var(THROTTLE_ENV, "per_call_ms=five") };
    let err = CacheStore::open("memory://throttle-env/").unwrap_err();
    assert!(matches!(err, CacheError::Format(_)), "{err}");
    assert!(err.to_string().contains(THROTTLE_ENV) && err.to_string().contains("five"), "{err}");

    // SAFETY: as above.
    unsafe { std::env::set_var(THROTTLE_ENV, "per_call_ms=40") };
    let cache = CacheStore::open("memory://throttle-env/").unwrap();
    let started = Instant::now();
    cache.probe(10).await.unwrap();
    assert!(started.elapsed().as_millis() >= 80, "put and get wait 40 ms each: {:?}", started.elapsed());

    // SAFETY: as above.
    unsafe { std::env::remove_var(THROTTLE_ENV) };
    let started = Instant::now();
    CacheStore::open("memory://throttle-env/").unwrap().probe(10).await.unwrap();
    assert!(started.elapsed().as_millis() < 80, "{:?}", started.elapsed());
}

//! The autocacher's service side against a `file://` cache store: a profile finds the splits
//! already in the store and decides to read them; eviction removes an unused entry over the
//! budget and keeps the one in use.

use granary_dispatcher::{Catalog, Dispatcher, DispatcherConfig};
use granary_proto::v1 as pb;
use granary_proto::v1::dispatcher_server::Dispatcher as _;
use granary_store::cache::{CacheStore, EntryInfo, FORMAT_VERSION, Fingerprint};
use std::path::Path;
use std::sync::Arc;
use tonic::Request;

struct TwoSplits;

impl Catalog for TwoSplits {
    fn describe(&self, _: &granary_crds::Manifest) -> Result<granary_dispatcher::Listing, String> {
        Ok(granary_dispatcher::Listing::single(vec![3, 3]))
    }
}

fn fp(n: u8) -> String {
    format!("{:064x}", u64::from(n) + 0x5eed)
}

fn manifest(store: &str) -> granary_crds::Manifest {
    let text = format!(
        r#"
apiVersion: granary.dev/v1alpha1
kind: InputPipeline
metadata: {{name: p}}
spec:
  source: {{url: "memory://data/", format: files}}
  stages:
    - op: image.decode
      name: small
  batch: {{size: 2}}
  epochs: 2
  cache: {{policy: at, at: small, store: "{store}"}}
"#
    );
    granary_crds::parse_manifest(&text, Path::new("/"), &[]).unwrap()
}

fn profile() -> pb::CacheProfile {
    let boundary = |index: u32, stage: &str| pb::CacheBoundary {
        index,
        stage: stage.into(),
        fingerprint: fp(index as u8),
        prefix_seconds_per_element: 0.001,
        suffix_seconds_per_element: 0.001,
        bytes_per_element: 10.0,
        ..Default::default()
    };
    pb::CacheProfile {
        compute_seconds_per_element: 0.002,
        cores: 2,
        read_bytes_per_second: 1e8,
        write_bytes_per_second: 1e8,
        boundaries: vec![boundary(0, "source"), boundary(1, "small")],
        sampled_elements: 10,
        error: String::new(),
    }
}

async fn write_entry(store: &CacheStore, fp: &str, pipeline: &str, splits: u64) {
    let parsed = Fingerprint::parse(fp).unwrap();
    let info = EntryInfo {
        format_version: FORMAT_VERSION,
        fingerprint: fp.to_string(),
        pipeline: pipeline.into(),
        source_url: "memory://data/".into(),
        boundary: 1,
        stage: "small".into(),
        stages: vec!["small".into()],
        splits_total: splits,
        created_unix_s: 1,
        last_used_unix_s: 1,
    };
    store.put_entry_info(&info).await.unwrap();
    for split in 0..splits {
        let mut w = store.split_writer(&parsed, split, "test");
        for i in 0..3u8 {
            w.push(&[i; 100]).await.unwrap();
        }
        w.finish().await.unwrap();
    }
}

#[tokio::test]
async fn a_profile_reads_what_the_store_holds_and_eviction_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/", dir.path().display());
    let store = CacheStore::open(&url).unwrap();
    write_entry(&store, &fp(1), "p", 2).await;
    write_entry(&store, &fp(9), "old", 1).await;

    let config = DispatcherConfig { cache_max_bytes: Some(1), ..Default::default() };
    let d = Dispatcher::new(config, Arc::new(TwoSplits)).await.unwrap();
    let info = d.register("p", &manifest(&url)).await.unwrap();
    assert!(info.cache_profile_wanted);

    // A malformed fingerprint is refused.
    let mut bad = profile();
    bad.boundaries[0].fingerprint = "nope".into();
    let req = pb::ReportCacheProfileRequest {
        worker_id: "w".into(),
        pipeline: "p".into(),
        generation: info.generation,
        profile: Some(bad),
    };
    let e = d.report_cache_profile(Request::new(req)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    let req = pb::ReportCacheProfileRequest {
        worker_id: "w".into(),
        pipeline: "p".into(),
        generation: info.generation,
        profile: Some(profile()),
    };
    d.report_cache_profile(Request::new(req)).await.unwrap();
    let report = d.cache_report("p").unwrap();
    let decision = report.decision.unwrap();
    assert_eq!(
        decision.action,
        granary_policies::caching::Action::Read { boundary: 1 },
        "{}",
        decision.reason
    );
    assert_eq!(report.fingerprint, Some(fp(1)));
    assert_eq!(report.store.as_deref(), Some(url.as_str()));

    // The first read lease touches the entry.
    let w = pb::RegisterWorkerRequest { address: "127.0.0.1:1".into(), ..Default::default() };
    let worker_id = d.register_worker(Request::new(w)).await.unwrap().into_inner().worker_id;
    let c = pb::RegisterClientRequest {
        pipeline: "p".into(),
        num_consumers: 1,
        wants_data: true,
        ..Default::default()
    };
    d.register_client(Request::new(c)).await.unwrap();
    let lease = d
        .lease_split(Request::new(pb::LeaseSplitRequest { worker_id, ..Default::default() }))
        .await
        .unwrap()
        .into_inner();
    let task = lease.lease.unwrap().cache.unwrap();
    assert_eq!((task.mode, task.fingerprint), (pb::CacheMode::Read as i32, fp(1)));
    let mut touched = false;
    for _ in 0..100 {
        let entries = store.list_entries().await.unwrap();
        let used = entries
            .iter()
            .find(|e| e.fingerprint == fp(1))
            .and_then(|e| e.info.as_ref())
            .map(|i| i.last_used_unix_s);
        if used.is_some_and(|t| t > 1) {
            touched = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(touched, "the entry's last use was not updated");

    // Over the 1-byte budget: the old entry goes, the one in use stays.
    d.evict_caches().await;
    let left: Vec<String> = store.list_entries().await.unwrap().into_iter().map(|e| e.fingerprint).collect();
    assert_eq!(left, vec![fp(1)]);
}

#[tokio::test]
async fn a_deleted_pipeline_takes_its_own_entries_and_leaves_those_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/", dir.path().display());
    let store = CacheStore::open(&url).unwrap();
    write_entry(&store, &fp(1), "ns/other", 2).await; // another pipeline's
    write_entry(&store, &fp(2), "ns/gone", 1).await; // the deleted one's, unused
    write_entry(&store, &fp(3), "ns/gone", 1).await; // the deleted one's, read by `p`

    let d = Dispatcher::new(DispatcherConfig::default(), Arc::new(TwoSplits)).await.unwrap();
    let info = d.register("p", &manifest(&url)).await.unwrap();
    let mut reads_three = profile();
    reads_three.boundaries[1].fingerprint = fp(3);
    let req = pb::ReportCacheProfileRequest {
        worker_id: "w".into(),
        pipeline: "p".into(),
        generation: info.generation,
        profile: Some(reads_three),
    };
    d.report_cache_profile(Request::new(req)).await.unwrap();
    assert_eq!(d.cache_report("p").unwrap().fingerprint, Some(fp(3)), "`p` uses the entry");

    let done = d.remove_cache_entries("ns/gone", &url).await.unwrap();
    assert_eq!((done.removed, done.kept), (vec![fp(2)], vec![fp(3)]));
    assert!(done.objects > 0 && done.bytes > 0);
    let left: Vec<String> = store.list_entries().await.unwrap().into_iter().map(|e| e.fingerprint).collect();
    assert_eq!(left, vec![fp(1), fp(3)]);
}

//! What crosses the wire: served elements are bit-identical to the in-process engine's, whether
//! the worker leaves the final `float32` `image.normalize` to the client (the default) or
//! applies it itself.

use granary_client::{BlockingClient, ClientOptions};
use granary_e2e::*;
use std::collections::BTreeMap;

/// Element key → (dtype, shape of one element, its bytes) of the `image` tensor.
type Elements = BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

fn in_process(data: &Dataset) -> Elements {
    let manifest = granary_crds::load_manifest(&data.manifest, &[]).expect("manifest loads");
    let engine = granary_worker::Engine::open(&manifest, granary_worker::EngineOptions::default())
        .expect("engine opens");
    let mut out = Elements::new();
    for batch in engine.run_epoch(0) {
        let batch = batch.expect("batch");
        let image = batch.tensors.iter().find(|t| t.name == "image").expect("image tensor");
        let row = image.data.len() / batch.keys.len();
        for (i, key) in batch.keys.iter().enumerate() {
            let bytes = image.data[i * row..(i + 1) * row].to_vec();
            out.insert(key.clone(), (image.dtype.name().to_string(), image.shape[1..].to_vec(), bytes));
        }
    }
    out
}

fn served(data: &Dataset, worker_flags: &[&str], journal: &str) -> Elements {
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join(journal));
    let _worker = start_worker_with(&d.address, worker_flags);
    let mut options = ClientOptions::new("e2e");
    options.dispatcher = Some(d.address.clone());
    let client = BlockingClient::open(options).expect("client opens");
    let mut out = Elements::new();
    for batch in client {
        let batch = batch.expect("batch");
        assert_eq!(batch.epoch, 0);
        let image = batch.tensor("image").expect("image tensor");
        let rows = batch.keys.len();
        if rows == 0 {
            continue;
        }
        let row = image.data.len() / rows;
        for (i, key) in batch.keys.iter().enumerate() {
            let bytes = image.data[i * row..(i + 1) * row].to_vec();
            let previous = out.insert(key.clone(), (image.dtype.clone(), image.shape[1..].to_vec(), bytes));
            assert!(previous.is_none(), "{key} delivered twice");
        }
    }
    out
}

#[test]
fn served_elements_are_bit_identical_to_the_in_process_engine() {
    let data = large_dataset(24, 8, 8, 1);
    let expected = in_process(&data);
    assert_eq!(expected.len(), data.keys.len());
    let (dtype, shape, _) = expected.values().next().expect("an element");
    assert_eq!((dtype.as_str(), shape.as_slice()), ("float32", &[3, 224, 224][..]));
    for (flags, journal) in [(&[][..], "journal-client"), (&["--normalize-on-worker"][..], "journal-worker")]
    {
        let got = served(&data, flags, journal);
        assert_eq!(got.len(), expected.len(), "{flags:?}: every element once");
        for (key, want) in &expected {
            let have = got.get(key).unwrap_or_else(|| panic!("{flags:?}: {key} missing"));
            assert_eq!((&have.0, &have.1), (&want.0, &want.1), "{flags:?}: {key} dtype and shape");
            assert!(have.2 == want.2, "{flags:?}: {key} differs from the in-process engine");
        }
    }
}

//! What crosses the wire: served elements are bit-identical to the in-process engine's, whether
//! the worker leaves the final `float32` `image.normalize` to the client (the default) or
//! applies it itself, and whether the client makes the images from the worker's plans or the
//! worker makes them.

use granary_client::{BlockingClient, ClientOptions, ImagePlacement};
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

/// The elements served, and the tensor bytes that crossed the wire for them.
fn served(data: &Dataset, worker_flags: &[&str], images: ImagePlacement, journal: &str) -> (Elements, u64) {
    let d = start_dispatcher(&data.manifest, "127.0.0.1:0", &data.dir.path().join(journal));
    let _worker = start_worker_with(&d.address, worker_flags);
    let mut options = ClientOptions::new("e2e");
    options.dispatcher = Some(d.address.clone());
    options.images = Some(images);
    let client = BlockingClient::open(options).expect("client opens");
    let mut out = Elements::new();
    let mut wire = 0;
    for batch in client {
        let batch = batch.expect("batch");
        wire += batch.wire_bytes;
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
    (out, wire)
}

#[test]
fn served_elements_are_bit_identical_to_the_in_process_engine() {
    let data = large_dataset(24, 8, 8, 1);
    let expected = in_process(&data);
    assert_eq!(expected.len(), data.keys.len());
    let (dtype, shape, _) = expected.values().next().expect("an element");
    assert_eq!((dtype.as_str(), shape.as_slice()), ("float32", &[3, 224, 224][..]));
    let pixels = (expected.len() * 224 * 224 * 3) as u64;
    let cases = [
        (&[][..], ImagePlacement::Workers, "journal-client"),
        (&["--normalize-on-worker"][..], ImagePlacement::Workers, "journal-worker"),
        (&[][..], ImagePlacement::Client, "journal-images"),
        (&["--normalize-on-worker"][..], ImagePlacement::Client, "journal-images-worker"),
    ];
    for (flags, images, journal) in cases {
        let (got, wire) = served(&data, flags, images, journal);
        let case = format!("{flags:?} with images on {images:?}");
        assert_eq!(got.len(), expected.len(), "{case}: every element once");
        for (key, want) in &expected {
            let have = got.get(key).unwrap_or_else(|| panic!("{case}: {key} missing"));
            assert_eq!((&have.0, &have.1), (&want.0, &want.1), "{case}: {key} dtype and shape");
            assert!(have.2 == want.2, "{case}: {key} differs from the in-process engine");
        }
        // What crossed the wire (with the labels): the uint8 pixels, their float32 form, or the
        // JPEGs with their plans (a worker that normalizes makes its images itself).
        let within = |bytes: u64| wire >= bytes && wire < bytes + bytes / 100;
        match (flags.is_empty(), images) {
            (true, ImagePlacement::Client) => {
                assert!(wire < pixels / 4, "{case}: {wire} bytes, not the JPEGs")
            }
            (true, _) => assert!(within(pixels), "{case}: {wire} bytes"),
            (false, _) => assert!(within(pixels * 4), "{case}: {wire} bytes"),
        }
    }
}

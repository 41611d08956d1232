//! Test data shared by the worker's integration tests.

use bytes::Bytes;
use granary_worker::store::memory_store;
use object_store::ObjectStoreExt;
use object_store::path::Path as StorePath;
use std::collections::BTreeMap;

/// Writes `n` small JPEGs (varied sizes) and a labels file into `memory://NAME/`.
pub fn dataset(name: &str, n: usize) -> BTreeMap<String, i64> {
    let store = memory_store(name);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut labels = BTreeMap::new();
    let mut records = String::new();
    for i in 0..n {
        let (w, h) = (40 + (i * 7) % 50, 30 + (i * 11) % 60);
        let img = image::RgbImage::from_fn(w as u32, h as u32, |x, y| {
            image::Rgb([(x * 5 + i as u32) as u8, (y * 3) as u8, ((x + y) * 2) as u8])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&img).unwrap();
        let file = format!("train/{i:05}.jpg");
        rt.block_on(store.put(&StorePath::from(format!("data/{file}")), Bytes::from(jpeg).into())).unwrap();
        let label = ((i * 37) % 10) as i64;
        labels.insert(format!("{i:05}.jpg"), label); // keys are relative to the source URL
        records.push_str(&format!("{{\"file\": \"{file}\", \"label\": {label}}}\n"));
    }
    rt.block_on(store.put(&StorePath::from("data/labels.jsonl"), Bytes::from(records).into())).unwrap();
    labels
}

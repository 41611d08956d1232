//! `format: tfrecord`: TFRecord files of `tf.train.Example` records, plain or GZIP-compressed; a
//! file is a split, streamed record by record. Both CRCs of every record are checked
//! ([`record`]); each record's features become the element's fields ([`example`]), and its key
//! is `FILE#INDEX` (the record's index in the file, from 0).
//!
//! A file belongs to the source when its name contains `.tfrecord` (`train.tfrecord`,
//! `x.tfrecords`, `x.tfrecord.gz`, `x.tfrecord-00000-of-00008`) or ends in a shard suffix
//! `-NNNNN-of-NNNNN` (optionally `.gz`), as TensorFlow Datasets and the ImageNet scripts name
//! theirs. Whether it is GZIP-compressed is `spec.source.compression`, or by default whether its
//! name ends in `.gz`.

pub mod example;
pub mod record;

use super::{Emit, Object, SourceError, Split, SplitKind, blocking_reader, record_key, relative_key};
use crate::element::Element;
use crate::store::Located;
use bytes::Bytes;
use granary_crds::SourceSpec;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use prost::Message;
use record::RecordReader;
use std::io::{BufReader, Read};
use std::sync::Arc;
use tokio::runtime::Handle;

/// Bytes read from the store (and decompressed) at a time.
const BUFFER: usize = 1 << 16;

/// Whether a file named `name` is a TFRecord file by its name (see the module's documentation).
pub fn is_tfrecord_name(name: &str) -> bool {
    if name.contains(".tfrecord") {
        return true;
    }
    let name = name.strip_suffix(".gz").unwrap_or(name);
    // `...-00000-of-00008`
    let Some((head, total)) = name.rsplit_once("-of-") else { return false };
    let Some((_, index)) = head.rsplit_once('-') else { return false };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(index) && digits(total)
}

/// One split per TFRecord file, with its compression decided.
pub(super) fn splits(
    located: &Located,
    spec: &SourceSpec,
    objects: Vec<ObjectMeta>,
) -> Result<Vec<Split>, SourceError> {
    super::one_per_object(located, objects, "tfrecord", is_tfrecord_name, |object, name| {
        SplitKind::Tfrecord { object, gzip: spec.gzip(name) }
    })
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    object: &Object,
    gzip: bool,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let location = object.location.to_string();
    let file_key = relative_key(root, &object.location);
    let raw = BufReader::with_capacity(BUFFER, blocking_reader(store, &object.location, rt)?);
    let (stream, size): (Box<dyn Read>, Option<u64>) = if gzip {
        let decoder = flate2::bufread::MultiGzDecoder::new(raw);
        (Box::new(BufReader::with_capacity(BUFFER, decoder)), None)
    } else {
        (Box::new(raw), Some(object.size))
    };
    let mut records = RecordReader::new(stream, size, gzip);
    loop {
        let record = records.next_record().map_err(|e| {
            let hint = match &e {
                record::RecordError::Io { .. } if gzip => {
                    "; if the file is not GZIP-compressed, set spec.source.compression: none"
                }
                record::RecordError::LengthCrc { at, .. } if at.index == 0 && !gzip => {
                    "; if the file is GZIP-compressed, set spec.source.compression: gzip"
                }
                _ => "",
            };
            SourceError::data(location.clone(), format!("{e}{hint}"))
        })?;
        let Some(record) = record else { return Ok(()) };
        let at = record.at;
        let example = example::Example::decode(Bytes::from(record.data))
            .map_err(|e| SourceError::data(location.clone(), format!("{at}: not a tf.train.Example: {e}")))?;
        let mut element = Element::new(record_key(&file_key, '#', at.index));
        example::fill(&mut element, example)
            .map_err(|m| SourceError::data(location.clone(), format!("{at}: {m}")))?;
        if !emit(element) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_tfrecord_name;

    #[test]
    fn tfrecord_names() {
        for name in [
            "train.tfrecord",
            "train.tfrecords",
            "train.tfrecord.gz",
            "mnist-train.tfrecord-00000-of-00001",
            "train-00000-of-01024",
            "validation-00127-of-00128.gz",
        ] {
            assert!(is_tfrecord_name(name), "{name}");
        }
        for name in ["dataset_info.json", "features.json", "train", "x-of-00001", "a-b-of-c", "labels.txt"] {
            assert!(!is_tfrecord_name(name), "{name}");
        }
    }
}

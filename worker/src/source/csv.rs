//! `format: csv`: CSV files (`.csv`, `.tsv`) whose first row names the fields; each further row
//! is an element keyed `FILE#ROW` (the row's index after the header, from 0). A file is a split,
//! streamed row by row. Quoting follows RFC 4180; blank lines are skipped; every row must have as
//! many cells as the header.
//!
//! Cells are typed as the `jsonl` reader types JSON values: a cell that is a JSON number becomes
//! a scalar (`int64` for an integer that fits, else `float64`), any other cell is text (`007`,
//! `n/a`, `true` and an empty cell included). `table.cast` types a text column.
//!
//! With a [`Projection`], only the columns it names become fields: the other cells are parsed
//! (and every row still checked against the header) but neither converted nor copied.

use super::{
    Emit, Object, Projection, SourceError, Split, SplitKind, blocking_reader, record_key, relative_key,
    values,
};
use crate::element::{Element, FieldName, Value};
use crate::store::Located;
use granary_crds::SourceSpec;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};
use std::sync::Arc;
use tokio::runtime::Handle;

/// Whether a file named `name` is read by `format: csv`.
fn is_csv_name(name: &str) -> bool {
    name.ends_with(".csv") || name.ends_with(".tsv")
}

/// One split per CSV file, with its delimiter decided.
pub(super) fn splits(
    located: &Located,
    spec: &SourceSpec,
    objects: Vec<ObjectMeta>,
) -> Result<Vec<Split>, SourceError> {
    super::one_per_object(located, objects, "csv", is_csv_name, |object, name| SplitKind::Csv {
        object,
        delimiter: spec.csv_delimiter(name),
    })
}

/// The value of one cell (see the module's documentation).
pub fn cell_value(cell: &str) -> Value {
    let trimmed = cell.trim();
    if trimmed.starts_with(|c: char| c == '-' || c.is_ascii_digit())
        && let Ok(number) = serde_json::from_str::<serde_json::Number>(trimmed)
        && let Some(value) = values::from_json(&serde_json::Value::Number(number))
    {
        return value;
    }
    Value::Text(cell.to_string())
}

/// `location:LINE` of a CSV error, or `location` when the error has no position.
fn error_at(location: &str, e: &::csv::Error) -> String {
    match e.position() {
        Some(p) => format!("{location}:{}", p.line()),
        None => location.to_string(),
    }
}

/// What a CSV error means for the user.
fn explain(e: &::csv::Error) -> String {
    match e.kind() {
        ::csv::ErrorKind::UnequalLengths { expected_len, len, .. } => format!(
            "the row has {len} cells but the header has {expected_len}; every row needs one cell per \
             header column (quote cells that hold the delimiter, or set spec.source.delimiter)"
        ),
        ::csv::ErrorKind::Utf8 { err, .. } => {
            format!("field {} is not UTF-8 text ({err}); save the file as UTF-8", err.field() + 1)
        }
        _ => format!("cannot read CSV: {e}"),
    }
}

pub(super) fn read(
    store: &Arc<dyn ObjectStore>,
    root: &StorePath,
    object: &Object,
    delimiter: u8,
    projection: Option<&Projection>,
    rt: &Handle,
    emit: &mut Emit<'_>,
) -> Result<(), SourceError> {
    let location = object.location.to_string();
    let bad = |e: ::csv::Error| SourceError::data(error_at(&location, &e), explain(&e));
    let file_key = relative_key(root, &object.location);
    let mut reader = ::csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(true)
        .flexible(false)
        .buffer_capacity(1 << 16)
        .from_reader(blocking_reader(store, &object.location, rt)?);
    let header: Vec<String> = reader.headers().map_err(bad)?.iter().map(str::to_string).collect();
    for (i, name) in header.iter().enumerate() {
        if name.is_empty() {
            return Err(SourceError::data(
                format!("{location}:1"),
                format!("column {} of the header row has no name; every column needs one", i + 1),
            ));
        }
        if header[..i].contains(name) {
            return Err(SourceError::data(
                format!("{location}:1"),
                format!("the header row names column `{name}` twice; give each column its own name"),
            ));
        }
    }
    // The columns that become fields, by index: all of them without a projection.
    let kept: Vec<(usize, FieldName)> = header
        .iter()
        .enumerate()
        .filter(|(_, name)| projection.is_none_or(|p| p.contains(name)))
        .map(|(i, name)| (i, FieldName::from(name.as_str())))
        .collect();
    let mut record = ::csv::StringRecord::new();
    let mut row = 0u64;
    while reader.read_record(&mut record).map_err(bad)? {
        let mut element = Element::new(record_key(&file_key, '#', row));
        element.fields = kept
            .iter()
            .filter_map(|(i, name)| record.get(*i).map(|cell| (name.clone(), cell_value(cell))))
            .collect();
        row += 1;
        if !emit(element) {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    #[test]
    fn cells_are_typed_as_json_numbers_or_text() {
        assert_eq!(cell_value("42"), Value::Tensor(Tensor::scalar_i64(42)));
        assert_eq!(cell_value(" -3 "), Value::Tensor(Tensor::scalar_i64(-3)));
        assert_eq!(cell_value("2.5"), Value::Tensor(Tensor::scalar_f64(2.5)));
        assert_eq!(cell_value("1e3"), Value::Tensor(Tensor::scalar_f64(1000.0)));
        for text in ["007", "", "n/a", "true", "1,5", "-", "NaN", "inf", "12abc", "1 2"] {
            assert_eq!(cell_value(text), Value::Text(text.to_string()), "{text:?}");
        }
    }
}

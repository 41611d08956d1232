//! Operator families: which data an operator works on, and which source formats provide it.

use crate::source::SourceFormat;

/// The family of an operator (the part of its `op` name before the dot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `image.*`: encoded images and their pixels.
    Image,
    /// `text.*`: text and its tokens.
    Text,
    /// `table.*`: the columns of rows.
    Table,
    /// `test.*`: operators for testing the service itself.
    Test,
    /// `python.*`: the user's own Python functions, which take whatever the element holds.
    Python,
    /// `filter`: built-in predicates that keep or drop elements, on whatever field their
    /// predicate reads.
    Filter,
}

/// The source formats a family's operators can read, and why, for the message that names a stage
/// that does not fit its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatFit {
    /// The formats whose elements the family's operators read.
    pub formats: &'static [SourceFormat],
    /// What the operators need, and which formats provide it.
    pub needs: &'static str,
}

impl Family {
    /// Every family, in the order validation reports them.
    pub const ALL: [Family; 6] =
        [Family::Image, Family::Text, Family::Table, Family::Test, Family::Python, Family::Filter];

    /// The source formats this family's operators fit; `None` when they fit every format.
    pub fn format_fit(self) -> Option<FormatFit> {
        match self {
            Family::Image => Some(FormatFit {
                formats: &[SourceFormat::Files, SourceFormat::Webdataset, SourceFormat::Tfrecord],
                needs: "image operators need encoded image bytes, which `files`, `webdataset` and `tfrecord` \
                        sources provide",
            }),
            Family::Table => Some(FormatFit {
                formats: &[
                    SourceFormat::Jsonl,
                    SourceFormat::Parquet,
                    SourceFormat::Tfrecord,
                    SourceFormat::Csv,
                ],
                needs: "table operators work on rows, which `jsonl`, `parquet`, `tfrecord` and `csv` sources \
                        provide",
            }),
            Family::Text | Family::Test | Family::Python | Family::Filter => None,
        }
    }
}

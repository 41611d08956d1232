//! Table operators for Parquet and JSONL rows: column selection and numeric casts.

pub mod cast;
pub mod select;

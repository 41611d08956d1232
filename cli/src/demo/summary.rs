//! The demo data's summary as `granary demo` prints it: one line per dataset, with sizes.

use crate::demo::data::DataSummary;
use std::fmt;

/// `bytes` in megabytes (or kilobytes under one megabyte), one decimal.
fn size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} kB", bytes as f64 / 1e3)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl fmt::Display for DataSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  images/train/             {}, {}, with images/labels.jsonl",
            plural(self.images, "JPEG image", "JPEG images"),
            size(self.image_bytes)
        )?;
        writeln!(
            f,
            "  images-wds/               the same images in {}, {}",
            plural(self.shards, "WebDataset shard", "WebDataset shards"),
            size(self.shard_bytes)
        )?;
        writeln!(
            f,
            "  text/                     {} in {}, {}; tokenizer.json with {}",
            plural(self.text_lines, "line", "lines"),
            plural(self.text_files, "JSONL file", "JSONL files"),
            size(self.text_bytes),
            plural(self.vocab_size, "token", "tokens")
        )?;
        writeln!(
            f,
            "  tables/features.parquet   {} in {}, {}",
            plural(self.table_rows, "row", "rows"),
            plural(self.row_groups, "row group", "row groups"),
            size(self.table_bytes)
        )?;
        write!(f, "  total                     {}", size(self.total_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_was_written_without_field_names() {
        let summary = DataSummary {
            images: 256,
            image_bytes: 3_200_000,
            shards: 4,
            shard_bytes: 3_300_000,
            text_lines: 2000,
            text_files: 4,
            text_bytes: 250_000,
            vocab_size: 1500,
            table_rows: 5000,
            row_groups: 5,
            table_bytes: 400_000,
            total_bytes: 7_200_000,
        };
        let text = summary.to_string();
        assert!(text.contains("256 JPEG images, 3.2 MB"), "{text}");
        assert!(text.contains("4 WebDataset shards"), "{text}");
        assert!(text.contains("total                     7.2 MB"), "{text}");
        assert!(!text.contains("DataSummary") && !text.contains("image_bytes"), "{text}");
    }
}

//! Field paths such as `spec.stages[2].size`: parsing and formatting.

/// One step of a field path: a mapping key or a list index.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Seg {
    /// A mapping key (`size`).
    Key(String),
    /// A list index (`[2]`).
    Index(usize),
}

/// Formats `[Key(spec), Key(stages), Index(2), Key(size)]` as `spec.stages[2].size`.
pub(crate) fn format_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

/// Parses `spec.stages[2].size`; `None` when it is not a well-formed path.
pub(crate) fn parse_path(text: &str) -> Option<Vec<Seg>> {
    let mut out = Vec::new();
    for part in text.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => part.split_at(i),
            None => (part, ""),
        };
        if name.is_empty() || name.contains(']') || name.trim() != name {
            return None;
        }
        out.push(Seg::Key(name.to_string()));
        while !rest.is_empty() {
            let inner = rest.strip_prefix('[')?;
            let close = inner.find(']')?;
            let index = inner[..close].parse().ok()?;
            out.push(Seg::Index(index));
            rest = &inner[close + 1..];
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for p in ["spec", "spec.batch.size", "spec.stages[1].size", "spec.stages[1].mean[2]", "a[0][1]"] {
            assert_eq!(parse_path(p).map(|s| format_path(&s)).as_deref(), Some(p));
        }
        for bad in ["", ".", "spec.", "spec..x", "spec[x]", "spec[1", "[1]", "spec.stages[-1]", "a]b"] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }
}

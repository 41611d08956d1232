//! "Did you mean" hints for misspelt field, operator and stage names.

/// The known name closest to `name`, if it is close enough to be a likely typo.
pub(crate) fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// ` (did you mean `x`?)` when a known name is close to `name`, else empty.
pub(crate) fn did_you_mean(name: &str, known: &[&str]) -> String {
    closest(name, known).map(|best| format!(" (did you mean `{best}`?)")).unwrap_or_default()
}

/// The names as a list of code spans: `` `a`, `b` ``.
pub(crate) fn backticked(known: &[&str]) -> String {
    known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// Levenshtein distance; `usize::MAX` for names too long to be typos.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    if a.len() > 128 || b.len() > 128 {
        return usize::MAX;
    }
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_names_only() {
        assert_eq!(closest("bufer", &["buffer", "size"]), Some("buffer"));
        assert_eq!(closest("zzzzzz", &["buffer", "size"]), None);
        assert_eq!(did_you_mean("Sise", &["size"]), " (did you mean `size`?)");
        assert_eq!(backticked(&["a", "b"]), "`a`, `b`");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}

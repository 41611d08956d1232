//! The Kubernetes name forms that `spec.workers` fields must take: DNS subdomains and labels,
//! qualified names (label and annotation keys), label values, environment variable names, and
//! resource quantities.

/// Whether `s` is a DNS-1123 subdomain (ConfigMap, Secret, ServiceAccount names).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|label| is_dns_label(label, 63))
}

/// Whether `s` is a DNS-1123 label of at most `max` characters (volume names).
pub(crate) fn is_dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a qualified name: `[prefix/]name`, the prefix a DNS subdomain and the name at
/// most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric (label and
/// annotation keys).
pub(crate) fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    prefix.is_none_or(|p| !p.is_empty() && is_dns_subdomain(p)) && !name.is_empty() && is_label_value(name)
}

/// Whether `s` is a label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting
/// and ending alphanumeric.
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Whether `s` is an environment variable name Kubernetes accepts: letters, digits, `_`, `-` and
/// `.`, not starting with a digit.
pub(crate) fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Whether `s` is a resource quantity: a decimal number with an optional suffix (`500m`, `2`,
/// `1.5`, `4Gi`, `512M`, `1e3`).
pub(crate) fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits);
    let number_ok = !number.is_empty() && number != "." && number.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(|exp| {
        let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
        !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())
    });
    number_ok && suffix_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_forms() {
        for (s, ok) in
            [("augment", true), ("team.augment-v2", true), ("Augment", false), ("-a", false), ("", false)]
        {
            assert_eq!(is_dns_subdomain(s), ok, "{s}");
        }
        for (s, ok) in [
            ("app", true),
            ("example.com/tier", true),
            ("node.kubernetes.io/instance-type", true),
            ("/tier", false),
            ("a/b/c", false),
            ("Bad_Prefix.com/x", false),
            ("x-", false),
        ] {
            assert_eq!(is_qualified_name(s), ok, "{s}");
        }
        for (s, ok) in [("", true), ("v1.2_x", true), ("-v", false), (&"a".repeat(64), false)] {
            assert_eq!(is_label_value(s), ok, "{s}");
        }
        for (s, ok) in
            [("AWS_REGION", true), ("my.var-x", true), ("1ABC", false), ("A=B", false), ("", false)]
        {
            assert_eq!(is_env_name(s), ok, "{s}");
        }
        for (s, ok) in [
            ("500m", true),
            ("2", true),
            ("1.5", true),
            ("4Gi", true),
            ("1e3", true),
            ("two", false),
            ("4GB", false),
            ("", false),
            (".", false),
        ] {
            assert_eq!(is_quantity(s), ok, "{s}");
        }
    }
}

//! Kubernetes' `$(VAR)` expansion of env values, commands and args, with the semantics of
//! `third_party/forked/golang/expansion` in the Kubernetes tree: `$(NAME)` becomes the value of
//! `NAME` when it is defined, and stays as written when it is not; `$$` is an escaped `$`, so
//! `$$(X)` becomes the literal `$(X)`; a `$` before anything else, or an unterminated `$(`, stays.

/// Expands every `$(NAME)` in `input` that `lookup` knows; unknown references stay as written.
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            // A trailing `$` is copied as is.
            None => {
                out.push('$');
                rest = after;
            }
            // `$$` is an escaped operator.
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..1 + close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 2..];
                }
                // An unterminated reference: `$(` is copied and scanning goes on after it.
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            // A `$` before anything else is copied with the character after it.
            Some(other) => {
                out.push('$');
                out.push(other);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::expand;
    use std::collections::BTreeMap;

    fn with(vars: &[(&str, &str)], input: &str) -> String {
        let map: BTreeMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        expand(input, |name| map.get(name).map(String::as_str))
    }

    #[test]
    fn known_references_expand_and_unknown_ones_stay() {
        let vars = [("POD_IP", "127.0.0.1"), ("EMPTY", "")];
        assert_eq!(with(&vars, "$(POD_IP):7071"), "127.0.0.1:7071");
        assert_eq!(with(&vars, "a$(EMPTY)b"), "ab");
        assert_eq!(with(&vars, "$(NOPE)-$(POD_IP)"), "$(NOPE)-127.0.0.1");
        assert_eq!(with(&vars, "$(POD_IP)$(POD_IP)"), "127.0.0.1127.0.0.1");
        assert_eq!(with(&vars, "plain"), "plain");
        assert_eq!(with(&vars, ""), "");
    }

    #[test]
    fn escapes_and_malformed_references_follow_kubernetes() {
        let vars = [("VAR_A", "A"), ("VAR_B", "B")];
        // Cases from Kubernetes' expand_test.go.
        assert_eq!(with(&vars, "$$(VAR_A)"), "$(VAR_A)");
        assert_eq!(with(&vars, "$$$(VAR_A)"), "$A");
        assert_eq!(with(&vars, "$$$$(VAR_A)"), "$$(VAR_A)");
        assert_eq!(with(&vars, "foo$$"), "foo$");
        assert_eq!(with(&vars, "$VAR_A"), "$VAR_A");
        assert_eq!(with(&vars, "$(VAR_A"), "$(VAR_A");
        assert_eq!(with(&vars, "$("), "$(");
        assert_eq!(with(&vars, "$()"), "$()");
        assert_eq!(with(&vars, "foo$"), "foo$");
        assert_eq!(with(&vars, "$(VAR_A)$(VAR_B"), "A$(VAR_B");
        assert_eq!(with(&vars, "$(VAR_A)_$(VAR_B)"), "A_B");
        assert_eq!(with(&vars, "$$(VAR_A"), "$(VAR_A");
        assert_eq!(with(&vars, "é$é$(VAR_A)"), "é$éA");
    }
}

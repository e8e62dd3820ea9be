//! `$(VAR)` references in strings, as the kubelet's forked Go `expansion`
//! package (third_party/forked/golang/expansion): used for container `command`,
//! `args` and `env` values and for volume mounts' `subPathExpr`. Pure.

/// Expands `$(NAME)` references in `input` with `lookup`, as the kubelet's
/// `expansion.Expand`: `$$` is an escaped `$`, an undefined or unterminated
/// reference is kept as written, and a `$` before anything else stays.
#[must_use]
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn expansion_table() {
        let cases = [
            ("$(A)", "a"),
            ("x$(A)y$(B)z", "xaybz"),
            ("$(UNDEFINED)", "$(UNDEFINED)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$a"),
            ("$$", "$"),
            ("$", "$"),
            ("a$b", "a$b"),
            ("$(A", "$(A"),
            ("$()", "$()"),
            ("$(A)$(A)", "aa"),
            ("plain", "plain"),
            ("", ""),
        ];
        let lookup = vars(&[("A", "a"), ("B", "b")]);
        for (input, want) in cases {
            assert_eq!(expand(input, &lookup), want, "{input:?}");
        }
    }
}

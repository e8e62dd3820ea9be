//! `$(VAR)` references in strings, as the kubelet's forked Go `expansion`
//! package (third_party/forked/golang/expansion): used for container `command`,
//! `args` and `env` values and for volume mounts' `subPathExpr`. Pure.

/// Expands `$(NAME)` references in `input` with `lookup`, as the kubelet's
/// `expansion.Expand`: `$$` is an escaped `$`, an undefined or unterminated
/// reference is kept as written, and a `$` before anything else stays.
#[must_use]
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    expand_at_most(input, lookup, usize::MAX).unwrap_or_default()
}

/// [`expand`], giving up with `None` as soon as the result would be longer
/// than `max` bytes: references that multiply a value (`$(A)$(A)…`, each
/// variable twice its predecessor) cost at most `max` bytes of memory, never
/// their full expansion.
#[must_use]
pub fn expand_at_most(
    input: &str,
    lookup: impl Fn(&str) -> Option<String>,
    max: usize,
) -> Option<String> {
    let mut out = String::with_capacity(input.len().min(max));
    let push = |out: &mut String, s: &str| {
        (out.len().checked_add(s.len())? <= max).then(|| out.push_str(s))
    };
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        push(&mut out, &rest[..pos])?;
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            push(&mut out, "$")?;
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(v) => push(&mut out, &v)?,
                        None => {
                            push(&mut out, "$(")?;
                            push(&mut out, name)?;
                            push(&mut out, ")")?;
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    push(&mut out, "$(")?;
                    rest = body;
                }
            }
        } else {
            push(&mut out, "$")?;
            rest = after;
        }
    }
    push(&mut out, rest)?;
    Some(out)
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
    fn expansion_stops_at_its_bound() {
        let lookup = vars(&[("A", "aaaa")]);
        assert_eq!(
            expand_at_most("x$(A)y", &lookup, 6).as_deref(),
            Some("xaaaay")
        );
        assert_eq!(expand_at_most("x$(A)y", &lookup, 5), None);
        assert_eq!(expand_at_most("$(B)", &lookup, 4).as_deref(), Some("$(B)"));
        assert_eq!(
            expand_at_most("$(B)", &lookup, 3),
            None,
            "kept as written, counted"
        );
        assert_eq!(expand_at_most("", &lookup, 0).as_deref(), Some(""));
        // A doubling chain: 2^40 bytes if expanded, refused within the bound.
        let mut env: BTreeMap<String, String> = BTreeMap::from([("V0".into(), "x".into())]);
        for i in 1..=40 {
            let prev = format!("$(V{})", i - 1);
            let look = |k: &str| env.get(k).cloned();
            match expand_at_most(&prev.repeat(2), look, 1 << 20) {
                Some(v) => {
                    env.insert(format!("V{i}"), v);
                }
                None => {
                    assert_eq!(i, 21, "2^21 bytes is the first over 1 MiB");
                    return;
                }
            }
        }
        panic!("never refused");
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

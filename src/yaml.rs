//! YAML read as the kubelet reads its files and manifests: sigs.k8s.io/yaml
//! over go-yaml v2, that is YAML 1.1 scalars (`yes`, `on`, `true` … are
//! booleans, `010` is octal 8) and a key given twice keeping its last value
//! (its lenient decoding; the kubelet falls back to it for its configuration
//! file too, with a warning). serde-saphyr's default budget bounds what an
//! input can cost (alias expansion, nesting, events).

use serde::de::DeserializeOwned;

/// The parser's options for the kubelet's YAML (see the module).
fn options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    o.legacy_octal_numbers = true;
    o
}

/// One YAML document `text` as `T`, read as the kubelet reads it.
///
/// # Errors
/// The text is not one YAML document, is over the parser's budget, or does
/// not fit `T` (the message names the line and column).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// [`from_str`] of bytes (UTF-8, or UTF-16/32 with a byte order mark).
///
/// # Errors
/// As [`from_str`].
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_slice_with_options(bytes, options())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn scalars_are_yaml_1_1_as_go_yaml_v2_reads_them() {
        let v: Value =
            from_str("a: yes\nb: on\nc: off\nd: 010\ne: 0x10\nf: ~\ng: '010'\n").unwrap();
        assert_eq!(
            v,
            json!({"a": true, "b": true, "c": false, "d": 8, "e": 16, "f": null, "g": "010"})
        );
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value() {
        let v: Value =
            from_slice(b"kind: Pod\nmetadata: {name: a}\nmetadata: {name: b}\n").unwrap();
        assert_eq!(v["metadata"]["name"], "b");
    }

    #[test]
    fn more_than_one_document_or_a_bad_one_is_an_error() {
        assert!(from_str::<Value>("a: 1\n---\nb: 2\n").is_err());
        assert!(from_str::<Value>("a: b: c\n").is_err());
        let e = from_str::<Value>("a: [1\n").unwrap_err().to_string();
        assert!(e.contains("line"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        // The budget's depth is 64; a flow and a block tree far deeper.
        let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert!(from_str::<Value>(&deep).is_err());
        let mut block = String::new();
        for i in 0..200 {
            block.push_str(&" ".repeat(i));
            block.push_str("k:\n");
        }
        assert!(from_str::<Value>(&block).is_err());
    }

    #[test]
    fn an_alias_bomb_is_refused_within_the_budget() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(from_str::<Value>(&text).is_err());
    }
}

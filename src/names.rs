//! Names as the API validates them (apimachinery's `validation` package):
//! what a node checks again before a name from a spec or a plugin becomes
//! part of a request path or a file path. Pure.

/// True for an RFC 1123 label (lower-case alphanumerics and `-`, at most 63
/// characters, alphanumeric at both ends), as apimachinery's `IsDNS1123Label`.
#[must_use]
pub fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || c == '-')
}

/// True for an RFC 1123 subdomain (dot-separated labels, at most 253
/// characters), as apimachinery's `IsDNS1123Subdomain`.
#[must_use]
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Checks a qualified name (`[prefix/]name`: an optional DNS subdomain
/// prefix, a name of at most 63 alphanumerics, `-`, `_` and `.`, alphanumeric
/// at both ends), as apimachinery's `IsQualifiedName`, the rule of label and
/// annotation keys.
///
/// # Errors
/// What is wrong, in apimachinery's words.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        if !is_dns1123_subdomain(prefix) {
            return Err("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
        }
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    if !(name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.')))
    {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

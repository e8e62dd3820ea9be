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

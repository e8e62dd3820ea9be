//! Registries as pull credentials name them, as the kubelet's
//! `credentialprovider` (keyring.go, config.go): where an image lives (its
//! registry host and repository path, Docker Hub's defaults spelt out), and
//! whether a registry key (`host[:port][/path]`, `*` globs per host label, a
//! scheme ignored) covers it (`URLsMatchStr`), the rule pull secrets' keys,
//! credential providers' `matchImages` and their answers' registries are
//! matched by. Pure.

/// The Docker Hub registry as keys may name it.
const DOCKER_HUB: &str = "index.docker.io";

/// The repository an image reference names, with Docker Hub's defaults
/// spelt out and tag and digest dropped: `busybox:1.36`,
/// `docker.io/library/busybox` and `index.docker.io/library/busybox@sha256:…`
/// all name `docker.io/library/busybox`, as the runtime resolves them to one
/// image.
#[must_use]
pub fn normalized_repository(image: &str) -> String {
    let (host, path) = image_location(image);
    let host = if host == DOCKER_HUB {
        "docker.io"
    } else {
        host.as_str()
    };
    format!("{host}/{path}")
}

/// The registry host (with port) and repository path of an image reference,
/// with Docker Hub's defaults (`busybox` is `index.docker.io/library/busybox`).
pub fn image_location(image: &str) -> (String, String) {
    let name = crate::image_policy::image_name(image);
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            let host = if first == "docker.io" {
                DOCKER_HUB
            } else {
                first
            };
            (host.to_string(), rest.to_string())
        }
        Some(_) => (DOCKER_HUB.to_string(), name.to_string()),
        None => (DOCKER_HUB.to_string(), format!("library/{name}")),
    }
}

/// A key without scheme and trailing slash; Docker Hub's names made one.
pub fn normalize_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key)
        .trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    match k.split_once('/') {
        Some((h, rest)) if is_docker_hub(h) => format!("{DOCKER_HUB}/{rest}"),
        None if is_docker_hub(k) => DOCKER_HUB.to_string(),
        _ => k.to_string(),
    }
}

fn is_docker_hub(host: &str) -> bool {
    matches!(
        host,
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    )
}

/// The kubelet's `URLsMatch`: globbed host labels, equal ports, path prefix.
pub fn key_matches(key: &str, host: &str, path: &str) -> bool {
    let key = normalize_key(key);
    let (key_host, key_path) = key.split_once('/').unwrap_or((&key, ""));
    let split = |h: &str| -> (String, String) {
        match h.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), port.to_string()),
            None => (h.to_string(), String::new()),
        }
    };
    let ((key_name, key_port), (name, port)) = (split(key_host), split(host));
    if key_port != port {
        return false;
    }
    let key_labels: Vec<&str> = key_name.split('.').collect();
    let labels: Vec<&str> = name.split('.').collect();
    if key_labels.len() != labels.len() || !key_labels.iter().zip(&labels).all(|(g, l)| glob(g, l))
    {
        return false;
    }
    key_path.is_empty() || path == key_path || path.starts_with(&format!("{key_path}/"))
}

/// The longest host label (bytes) that is matched at all: a DNS label's
/// 63. A longer label, in a key or in an image's host, names no registry.
pub const MAX_LABEL_BYTES: usize = 63;

/// One host label against a key's glob label, as the kubelet's
/// `filepath.Match` per label: `*` is any run of characters, `?` any one.
/// wildmatch's matcher never backtracks past its last `*`, so the work is
/// at most the product of the two lengths, each at most
/// [`MAX_LABEL_BYTES`]: a pull secret's key cannot make the agent try each
/// way to split a host among its stars.
fn glob(pattern: &str, text: &str) -> bool {
    pattern.len() <= MAX_LABEL_BYTES
        && text.len() <= MAX_LABEL_BYTES
        && wildmatch::WildMatch::new(pattern).matches(text)
}

/// Whether registry `pattern` (`host[:port][/path]`, globs per host label, a
/// scheme ignored) covers `image`, as the kubelet's `URLsMatchStr`: the rule
/// pull secrets' keys are looked up by, which the kubelet also applies to
/// credential provider plugins' `matchImages`.
#[must_use]
pub fn registry_matches(pattern: &str, image: &str) -> bool {
    let (host, path) = image_location(image);
    key_matches(pattern, &host, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_split_into_registry_and_path() {
        let cases = [
            ("busybox", ("index.docker.io", "library/busybox")),
            ("busybox:1.36", ("index.docker.io", "library/busybox")),
            ("me/app:1", ("index.docker.io", "me/app")),
            (
                "docker.io/library/nginx",
                ("index.docker.io", "library/nginx"),
            ),
            (
                "127.0.0.1:5000/private/busybox:1",
                ("127.0.0.1:5000", "private/busybox"),
            ),
            ("localhost/x", ("localhost", "x")),
            ("gcr.io/p/img@sha256:abc", ("gcr.io", "p/img")),
        ];
        for (image, (host, path)) in cases {
            assert_eq!(image_location(image), (host.into(), path.into()), "{image}");
        }
    }

    #[test]
    fn keys_match_as_the_kubelets_keyring() {
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000", "127.0.0.1:5001/private/b:1", false),
            ("http://127.0.0.1:5000/", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000/private", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000/priv", "127.0.0.1:5000/private/b:1", false),
            ("*.gcr.io", "eu.gcr.io/p/i", true),
            ("*.gcr.io", "gcr.io/p/i", false),
            ("*.gcr.io", "a.b.gcr.io/p/i", false),
            ("registry-*.corp", "registry-1.corp/i", true),
            ("https://index.docker.io/v1/", "busybox", true),
            ("docker.io", "me/app", true),
            ("quay.io", "busybox", false),
        ];
        for (key, image, want) in cases {
            let (host, path) = image_location(image);
            assert_eq!(key_matches(key, &host, &path), want, "{key} vs {image}");
        }
    }

    #[test]
    fn globs_match_runs_of_characters() {
        assert!(glob("*", "anything"));
        assert!(glob("a*c", "abbbc"));
        assert!(!glob("a*c", "abbb"));
        assert!(glob("*-east", "us-east"));
        assert!(glob("registry-?", "registry-1"));
        assert!(!glob("registry-?", "registry-12"));
    }

    #[test]
    fn a_glob_bomb_key_is_matched_without_backtracking() {
        // C(60, 20) ways to place the stars: a backtracking matcher never
        // returns from these; a linear one answers at once.
        let bomb = format!("{}c.x", "*a".repeat(20));
        let host = format!("{}.x", "a".repeat(60));
        assert!(!registry_matches(&bomb, &format!("{host}/img:1")));
        let near = format!("{}b.x", "a".repeat(60));
        assert!(!glob(&bomb.replace(".x", ""), &near.replace(".x", "")));
        assert!(registry_matches("*.gcr.io", "eu.gcr.io/p/i:1"));
        // Past a DNS label's length nothing matches, not even `*`: the work
        // stays bounded whatever a key or an image's host holds.
        assert!(glob("*", &"a".repeat(MAX_LABEL_BYTES)));
        assert!(!glob("*", &"a".repeat(MAX_LABEL_BYTES + 1)));
        assert!(!glob(
            &format!("*{}b", "a".repeat(500_000)),
            &"a".repeat(1 << 20)
        ));
    }
}

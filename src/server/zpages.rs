//! The node API's z-pages, `/statusz` and `/flagz`: the kubelet's beta
//! `ComponentStatusz` and `ComponentFlagz` (on by default since 1.36), which
//! it installs last on its authorized server (pkg/kubelet/server/server.go,
//! `InstallZPages`) from the apiserver's `pkg/server/statusz` and
//! `pkg/server/flagz`. Pure rendering: a request's `Accept`, query and
//! `User-Agent` in, a [`Reply`] out; the time and the text page's delimiter
//! enter as parameters.
//!
//! Content negotiation, as `statusz.go` and `flagz.go` do it with the
//! apiserver's `negotiation.NegotiateOutputMediaType` (the `Accept` clauses
//! parsed and ordered as `goautoneg.ParseAccept` does):
//! - no or a blank `Accept`, or a clause matching `text/plain` without `as`,
//!   `g` or `v` (`text/plain`, `text/*`, `*/*`): the text page, 200,
//!   `text/plain; charset=utf-8` ([`statusz_text`], [`flagz_text`]).
//! - a clause matching `application/json` or `application/yaml` with
//!   `as=Statusz` (`as=Flagz`), `g=config.k8s.io` and `v=v1beta1`, or the
//!   deprecated `v=v1alpha1` (answered with a `Warning: 299 - "…"` header):
//!   the structured object, 200, `Content-Type:
//!   application/json;g=config.k8s.io;v=v1beta1;as=Statusz`. JSON is
//!   indented for `?pretty=true`, a `pretty=1` parameter or a `curl`, `Wget`
//!   or `Mozilla/5.0` `User-Agent`; compact JSON ends with a newline. YAML
//!   has its keys sorted.
//! - anything else (`application/json` alone, another kind or version,
//!   `application/xml`, `stream=` or `sv=` parameters): 406 with a v1
//!   `Status` (`reason: NotAcceptable`, `only the following media types are
//!   accepted: application/json, application/yaml, text/plain`), itself
//!   negotiated as the apiserver's `ErrorNegotiated` does: compact JSON (or
//!   YAML) when a clause takes JSON (YAML) without `as`, otherwise indented
//!   JSON, both `Content-Type: application/json`.
//!
//! The kubelet's `CBORServingAndStorage` gate is alpha and off, so CBOR is
//! not offered, as the kubelet does not offer it.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// The component the pages name (`metadata.name`, the text header): the
/// kubelet's `ComponentKubelet`, since this is the kubelet's API.
pub const COMPONENT: &str = "kubelet";

/// The API group of the structured pages.
pub const GROUP: &str = "config.k8s.io";

/// The delimiters between a field's name and its value on the text pages;
/// one is picked at random ([`random_delimiter`]) so that nobody parses them.
pub const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

/// The second line of both text pages.
const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no \
formatting compatibility guarantees and is for debugging purposes only.";

/// The media types offered, in the apiserver codec factory's order.
const MEDIA: [Media; 3] = [Media::Json, Media::Yaml, Media::Text];

/// Which z-page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// `/statusz`.
    Statusz,
    /// `/flagz`.
    Flagz,
}

impl Page {
    /// The structured object's kind (`Statusz`, `Flagz`).
    #[must_use]
    pub const fn kind(self) -> &'static str {
        match self {
            Self::Statusz => "Statusz",
            Self::Flagz => "Flagz",
        }
    }

    /// The page's name in its text header and deprecation warning.
    const fn name(self) -> &'static str {
        match self {
            Self::Statusz => "statusz",
            Self::Flagz => "flagz",
        }
    }
}

/// What `/statusz` reports: the kubelet's statusz registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// When the agent started, in whole seconds (the kubelet's process
    /// start time, which has no finer unit).
    pub started: Timestamp,
    /// The `goVersion` field and the text page's `Go version` line: the
    /// kubelet's Go toolchain version; here the Rust compiler this agent was
    /// built with (`rustc 1.x.y (<commit> <date>)`).
    pub go_version: String,
    /// The agent's own version, `rustlet <version>` (the kubelet's binary
    /// version).
    pub binary_version: String,
    /// The Kubernetes version whose kubelet this agent follows, as
    /// `<major>.<minor>` (the kubelet's emulation version).
    pub emulation_version: String,
    /// The first segments of the paths listed ([`aggregate_paths`]), sorted.
    pub paths: Vec<String>,
}

impl Status {
    /// The status of this build started at `started` (cut to whole seconds)
    /// serving `listed` paths.
    #[must_use]
    pub fn new(started: Timestamp, listed: &[&str]) -> Self {
        Self {
            started: Timestamp::from_second(started.as_second()).unwrap_or(started),
            go_version: env!("RUSTLET_RUSTC_VERSION").to_string(),
            binary_version: format!("rustlet {}", env!("CARGO_PKG_VERSION")),
            emulation_version: emulation_version(crate::KUBERNETES_VERSION),
            paths: aggregate_paths(listed),
        }
    }
}

/// `<major>.<minor>` of a Kubernetes version such as `v1.37.0` (the
/// kubelet's emulation version is its binary version's major and minor).
#[must_use]
pub fn emulation_version(kubernetes_version: &str) -> String {
    let v = kubernetes_version.trim_start_matches('v');
    let mut parts = v.split(['.', '-', '+']);
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}"),
        _ => v.to_string(),
    }
}

/// The paths `/statusz` lists, from the paths of the handlers a server
/// registered: each one's first segment (`/metrics/probes` is `/metrics`),
/// once, sorted, without the API server's discovery roots (`/api`, `/apis`,
/// `/openapi`, `/openid`, `/.well-known`), as the apiserver's
/// `aggregatePaths`.
#[must_use]
pub fn aggregate_paths(listed: &[&str]) -> Vec<String> {
    const NOT_FOR_DEBUGGING: [&str; 5] = ["/apis", "/api", "/openid", "/openapi", "/.well-known"];
    let mut out: Vec<String> = listed
        .iter()
        .filter_map(|p| p.split('/').nth(1).filter(|s| !s.is_empty()))
        .map(|segment| format!("/{segment}"))
        .filter(|folder| !NOT_FOR_DEBUGGING.contains(&folder.as_str()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whole seconds from `started` to `now`, never negative (`uptimeSeconds`).
#[must_use]
pub fn uptime_seconds(started: Timestamp, now: Timestamp) -> i64 {
    now.duration_since(started).as_secs().max(0)
}

/// One of [`DELIMITERS`], at random (`": "` if the system has no randomness).
#[must_use]
pub fn random_delimiter() -> &'static str {
    getrandom::u32()
        .ok()
        .and_then(|r| usize::try_from(r % 4).ok())
        .map_or(DELIMITERS[1], |i| DELIMITERS[i])
}

/// The text page's header: an empty line, `<component> <page>`, the warning.
fn header(page: Page) -> String {
    format!("\n{COMPONENT} {}\n{WARNING}\n", page.name())
}

/// Escapes what HTML gives meaning to, as Go's `html.EscapeString` (the
/// text `/statusz` escapes its values so).
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

/// `t` as Go's `time.UnixDate` prints it in UTC (`Mon Jan  2 15:04:05 UTC
/// 2006`).
fn unix_date(t: Timestamp) -> String {
    k8s_openapi::jiff::fmt::strtime::format("%a %b %e %H:%M:%S UTC %Y", t)
        .unwrap_or_else(|_| t.to_string())
}

/// `t` as a `metav1.Time` in JSON: RFC 3339 in UTC, whole seconds.
fn rfc3339(t: Timestamp) -> String {
    k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", t)
        .unwrap_or_else(|_| t.to_string())
}

/// The text `/statusz` at `now`, each field's name followed by `delimiter`
/// and a space, then its value (here with `:`):
///
/// ```text
///
/// kubelet statusz
/// Warning: This endpoint is not meant to be machine parseable, …
///
/// Started: Tue May  5 10:00:00 UTC 2026
/// Up: 1 hr 02 min 03 sec
/// Go version: rustc 1.90.0 (…)
/// Binary version: rustlet 0.1.0
/// Emulation version: 1.37
/// Paths: /configz /flagz /healthz /metrics
/// ```
///
/// An empty emulation version or path list leaves its line empty. The start
/// is shown in UTC (the kubelet shows it in the node's local time zone).
#[must_use]
pub fn statusz_text(s: &Status, now: Timestamp, delimiter: &str) -> String {
    let d = html_escape(delimiter);
    let up = uptime_seconds(s.started, now);
    let emulation = if s.emulation_version.is_empty() {
        String::new()
    } else {
        format!("Emulation version{d} {}", html_escape(&s.emulation_version))
    };
    let paths = if s.paths.is_empty() {
        String::new()
    } else {
        format!("Paths{d} {}", html_escape(&s.paths.join(" ")))
    };
    format!(
        "{}\nStarted{d} {}\nUp{d} {}\nGo version{d} {}\nBinary version{d} {}\n{emulation}\n{paths}\n",
        header(Page::Statusz),
        html_escape(&unix_date(s.started)),
        html_escape(&format!(
            "{} hr {:02} min {:02} sec",
            up / 3600,
            (up / 60) % 60,
            up % 60
        )),
        html_escape(&s.go_version),
        html_escape(&s.binary_version),
    )
}

/// The text `/flagz`: the header, then `<name><delimiter><value>` a line,
/// by name.
#[must_use]
pub fn flagz_text(flags: &BTreeMap<String, String>, delimiter: &str) -> String {
    let mut out = header(Page::Flagz);
    for (name, value) in flags {
        out.push_str(&format!("{name}{delimiter}{value}\n"));
    }
    out
}

/// A request's headers and query, as far as the z-pages read them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// The `Accept` header.
    pub accept: Option<&'a str>,
    /// The raw query string (`pretty=true`).
    pub query: Option<&'a str>,
    /// The `User-Agent` header.
    pub user_agent: Option<&'a str>,
}

/// A z-page response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// 200, or 406 when no media type offered is acceptable.
    pub status: StatusCode,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The `Warning` header of a deprecated version.
    pub warning: Option<String>,
    /// The body.
    pub body: String,
}

/// What a page shows.
#[derive(Clone, Copy, Debug)]
pub enum Content<'a> {
    /// `/statusz`, at a time.
    Statusz(&'a Status, Timestamp),
    /// `/flagz`: the flags by name, their values as shown.
    Flagz(&'a BTreeMap<String, String>),
}

impl Content<'_> {
    const fn page(&self) -> Page {
        match self {
            Self::Statusz(..) => Page::Statusz,
            Self::Flagz(_) => Page::Flagz,
        }
    }

    fn text(&self, delimiter: &str) -> String {
        match self {
            Self::Statusz(s, now) => statusz_text(s, *now, delimiter),
            Self::Flagz(flags) => flagz_text(flags, delimiter),
        }
    }
}

/// The reply to `req` for `content`, its text delimited by `delimiter`
/// (the module's documentation gives the negotiation).
#[must_use]
pub fn respond(content: Content<'_>, req: Request<'_>, delimiter: &str) -> Reply {
    let text = || Reply {
        status: StatusCode::OK,
        content_type: "text/plain; charset=utf-8".to_string(),
        warning: None,
        body: content.text(delimiter),
    };
    let Some(accept) = req.accept.filter(|a| !a.trim().is_empty()) else {
        return text();
    };
    let clauses = parse_accept(accept);
    let page = content.page();
    match negotiate(&clauses, Restrictions::Page(page)) {
        Some((Media::Text, _)) => text(),
        Some((media, options)) => {
            let version = options.convert.map_or("", |gvk| gvk.version);
            let api_version = format!("{GROUP}/{version}");
            let object = match content {
                Content::Statusz(s, now) => statusz_object(s, now, &api_version),
                Content::Flagz(flags) => flagz_object(flags, &api_version),
            };
            let pretty = options.pretty || pretty_print(req);
            Reply {
                status: StatusCode::OK,
                content_type: format!(
                    "{};g={GROUP};v={version};as={}",
                    media.mime(),
                    page.kind()
                ),
                warning: (version == "v1alpha1").then(|| {
                    format!(
                        "299 - \"This version of the {} endpoint is deprecated. Please use a newer version.\"",
                        page.name()
                    )
                }),
                body: encode(&object, media, pretty),
            }
        }
        None => not_acceptable(&clauses, req),
    }
}

/// The 406 reply: a `Status`, negotiated with the apiserver's default
/// restrictions (no conversion), or indented JSON when none is acceptable.
fn not_acceptable(clauses: &[Clause<'_>], req: Request<'_>) -> Reply {
    let offered: Vec<&str> = MEDIA.iter().map(|m| m.mime()).collect();
    let message = format!(
        "only the following media types are accepted: {}",
        offered.join(", ")
    );
    let status = StatusObject {
        kind: "Status",
        api_version: "v1",
        metadata: Metadata::default(),
        status: "Failure",
        message: &message,
        reason: "NotAcceptable",
        code: StatusCode::NOT_ACCEPTABLE.as_u16(),
    };
    let (content_type, body) = match negotiate(clauses, Restrictions::Default) {
        Some((Media::Text, _)) => ("text/plain", format!("NotAcceptable: {message}")),
        Some((media, options)) => (
            media.mime(),
            encode(&status, media, options.pretty || pretty_print(req)),
        ),
        None => ("application/json", encode(&status, Media::Json, true)),
    };
    Reply {
        status: StatusCode::NOT_ACCEPTABLE,
        content_type: content_type.to_string(),
        warning: None,
        body,
    }
}

/// `metadata` of the objects: the component's name, or nothing (a
/// `Status`'s `{}`).
#[derive(Debug, Default, Serialize)]
struct Metadata<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// `config.k8s.io` `Statusz` (v1alpha1 and v1beta1 have the same fields),
/// fields in the Go type's order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatuszObject<'a> {
    kind: &'static str,
    api_version: &'a str,
    metadata: Metadata<'a>,
    start_time: String,
    uptime_seconds: i64,
    go_version: &'a str,
    binary_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    emulation_version: &'a str,
    /// `null` when there are none, as Go's nil slice.
    paths: Option<&'a [String]>,
}

/// `config.k8s.io` `Flagz`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FlagzObject<'a> {
    kind: &'static str,
    api_version: &'a str,
    metadata: Metadata<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    flags: &'a BTreeMap<String, String>,
}

/// The v1 `Status` of a refusal.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusObject<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Metadata<'static>,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

/// Either structured page, ready to encode.
enum Object<'a> {
    Statusz(StatuszObject<'a>),
    Flagz(FlagzObject<'a>),
}

impl Serialize for Object<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Statusz(o) => o.serialize(s),
            Self::Flagz(o) => o.serialize(s),
        }
    }
}

fn statusz_object<'a>(s: &'a Status, now: Timestamp, api_version: &'a str) -> Object<'a> {
    Object::Statusz(StatuszObject {
        kind: Page::Statusz.kind(),
        api_version,
        metadata: Metadata {
            name: Some(COMPONENT),
        },
        start_time: rfc3339(s.started),
        uptime_seconds: uptime_seconds(s.started, now),
        go_version: &s.go_version,
        binary_version: &s.binary_version,
        emulation_version: &s.emulation_version,
        paths: (!s.paths.is_empty()).then_some(s.paths.as_slice()),
    })
}

fn flagz_object<'a>(flags: &'a BTreeMap<String, String>, api_version: &'a str) -> Object<'a> {
    Object::Flagz(FlagzObject {
        kind: Page::Flagz.kind(),
        api_version,
        metadata: Metadata {
            name: Some(COMPONENT),
        },
        flags,
    })
}

/// `object` as the apiserver's serializers write it: compact JSON and a
/// newline, indented JSON (two spaces, no newline), or YAML with sorted
/// keys. JSON escapes `<`, `>`, `&`, U+2028 and U+2029 as Go's does.
fn encode(object: &impl Serialize, media: Media, pretty: bool) -> String {
    let written = match media {
        Media::Yaml => serde_json::to_value(object)
            .map(|mut v| {
                sort_keys(&mut v);
                v
            })
            .and_then(|v| {
                serde_saphyr::to_string(&v)
                    .map_err(<serde_json::Error as serde::ser::Error>::custom)
            }),
        Media::Json | Media::Text if pretty => serde_json::to_string_pretty(object),
        Media::Json | Media::Text => serde_json::to_string(object).map(|s| s + "\n"),
    };
    // The objects are strings, numbers and maps of strings: they always encode.
    let out = written.unwrap_or_default();
    if media == Media::Yaml {
        return out;
    }
    let mut escaped = String::with_capacity(out.len());
    for c in out.chars() {
        match c {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\u{2028}' => escaped.push_str("\\u2028"),
            '\u{2029}' => escaped.push_str("\\u2029"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Sorts every object's keys (YAML from Go's `sigs.k8s.io/yaml` has them so).
fn sort_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

/// Whether the request asks for indented output regardless of its
/// `Accept`: a `pretty` query parameter that Go's `strconv.ParseBool` reads
/// as true, or, without one, a curl, Wget or browser `User-Agent` (the
/// apiserver's `isPrettyPrint`).
fn pretty_print(req: Request<'_>) -> bool {
    if let Some(q) = req.query.filter(|q| q.contains("pretty")) {
        let value = form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "pretty")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        if !value.is_empty() {
            return matches!(value.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True");
        }
    }
    req.user_agent.is_some_and(|ua| {
        ua.starts_with("curl") || ua.starts_with("Wget") || ua.starts_with("Mozilla/5.0")
    })
}

/// A media type offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Media {
    Json,
    Yaml,
    Text,
}

impl Media {
    const fn mime(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Yaml => "application/yaml",
            Self::Text => "text/plain",
        }
    }

    /// Type and subtype.
    const fn parts(self) -> (&'static str, &'static str) {
        match self {
            Self::Json => ("application", "json"),
            Self::Yaml => ("application", "yaml"),
            Self::Text => ("text", "plain"),
        }
    }
}

/// Which conversions a negotiation allows: a z-page's (text without one,
/// JSON and YAML only to its own kind), or the apiserver's default
/// (none), which its error responses use.
#[derive(Clone, Copy, Debug)]
enum Restrictions {
    Page(Page),
    Default,
}

/// A group, version and kind asked for with `g`, `v` and `as`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Gvk<'a> {
    group: &'a str,
    version: &'a str,
    kind: &'a str,
}

/// What an accepted clause asks beyond its media type.
#[derive(Clone, Copy, Debug, Default)]
struct Options<'a> {
    pretty: bool,
    convert: Option<Gvk<'a>>,
}

/// One clause of an `Accept` header.
#[derive(Clone, Debug, PartialEq)]
struct Clause<'a> {
    ty: &'a str,
    sub: &'a str,
    q: f64,
    /// Parameters other than `q`; a repeated one keeps its last value.
    params: BTreeMap<&'a str, &'a str>,
}

/// `s` before and after the first `sep`, or all of `s` and nothing.
fn split_once_or_all(s: &str, sep: char) -> (&str, &str) {
    s.split_once(sep).unwrap_or((s, ""))
}

fn trim_spaces(s: &str) -> &str {
    s.trim_matches(' ')
}

/// The clauses of an `Accept` header, most preferred first, as
/// `goautoneg.ParseAccept`: a clause without a subtype (other than `*`) or
/// with two `/` is dropped, a parameter without exactly one `=` too, and an
/// unreadable `q` is 0. Ordered by its comparison (a higher `q` first, a
/// concrete type or subtype before a wildcard) with Go's insertion sort,
/// which is what Go's sort runs on up to 12 clauses; longer headers are
/// sorted stably by (`q`, wildcard type, wildcard subtype).
fn parse_accept(header: &str) -> Vec<Clause<'_>> {
    let mut out = Vec::new();
    let mut remaining = header;
    while !remaining.is_empty() {
        let (part, rest) = split_once_or_all(remaining, ',');
        remaining = rest;
        let (range, mut params) = split_once_or_all(trim_spaces(part), ';');
        let (ty, sub) = split_once_or_all(range, '/');
        let ty = trim_spaces(ty);
        let sub = if sub.is_empty() {
            if ty != "*" {
                continue;
            }
            "*"
        } else {
            let (sub, extra) = split_once_or_all(sub, '/');
            if !extra.is_empty() {
                continue;
            }
            trim_spaces(sub)
        };
        let mut clause = Clause {
            ty,
            sub,
            q: 1.0,
            params: BTreeMap::new(),
        };
        while !params.is_empty() {
            let (param, rest) = split_once_or_all(params, ';');
            params = rest;
            let (key, value) = split_once_or_all(param, '=');
            if value.is_empty() {
                continue;
            }
            let (value, extra) = split_once_or_all(value, '=');
            if !extra.is_empty() {
                continue;
            }
            let key = trim_spaces(key);
            if key == "q" {
                clause.q = value.parse::<f32>().map_or(0.0, f64::from);
            } else {
                clause.params.insert(key, trim_spaces(value));
            }
        }
        out.push(clause);
    }
    if out.len() <= 12 {
        for i in 1..out.len() {
            let mut j = i;
            while j > 0 && prefers(&out[j], &out[j - 1]) {
                out.swap(j, j - 1);
                j -= 1;
            }
        }
    } else {
        out.sort_by(|a, b| {
            b.q.total_cmp(&a.q)
                .then((a.ty == "*").cmp(&(b.ty == "*")))
                .then((a.sub == "*").cmp(&(b.sub == "*")))
        });
    }
    out
}

/// `goautoneg`'s comparison: whether `a` goes before `b`.
fn prefers(a: &Clause<'_>, b: &Clause<'_>) -> bool {
    a.q > b.q || (a.ty != "*" && b.ty == "*") || (a.sub != "*" && b.sub == "*")
}

/// The first media type offered that the first clause able to take one
/// accepts, with the clause's options (`NegotiateMediaTypeOptions`).
fn negotiate<'a>(clauses: &[Clause<'a>], r: Restrictions) -> Option<(Media, Options<'a>)> {
    clauses.iter().find_map(|clause| {
        MEDIA.iter().find_map(|&media| {
            let (ty, sub) = media.parts();
            let matches = (clause.ty == ty && (clause.sub == sub || clause.sub == "*"))
                || (clause.ty == "*" && clause.sub == "*");
            if !matches {
                return None;
            }
            accept_options(clause, media, r).map(|o| (media, o))
        })
    })
}

/// The clause's options if `media` may answer it under `r`
/// (`acceptMediaTypeOptions`): `stream` only as a JSON watch where watches
/// are allowed (never on a z-page), `sv` never, and a conversion only to a
/// kind the page serves.
fn accept_options<'a>(clause: &Clause<'a>, media: Media, r: Restrictions) -> Option<Options<'a>> {
    let mut options = Options::default();
    for (&key, &value) in &clause.params {
        match key {
            "as" => options.convert.get_or_insert_default().kind = value,
            "g" => options.convert.get_or_insert_default().group = value,
            "v" => options.convert.get_or_insert_default().version = value,
            "stream" => {
                let watch = matches!(r, Restrictions::Default) && media == Media::Json;
                let allowed = value.is_empty() || (watch && value == "watch");
                if !allowed {
                    return None;
                }
            }
            "sv" if !value.is_empty() => return None,
            "pretty" => options.pretty = value == "1",
            _ => {}
        }
    }
    let allowed = match (r, media, options.convert) {
        (_, _, None) => media == Media::Text || matches!(r, Restrictions::Default),
        (Restrictions::Page(page), Media::Json | Media::Yaml, Some(gvk)) => {
            gvk.kind == page.kind()
                && gvk.group == GROUP
                && matches!(gvk.version, "v1alpha1" | "v1beta1")
        }
        _ => false,
    };
    allowed.then_some(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BETA: &str = "application/json;as=Statusz;v=v1beta1;g=config.k8s.io";

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn status() -> Status {
        Status {
            started: at("2026-05-05T10:00:00Z"),
            go_version: "rustc 1.90.0".into(),
            binary_version: "rustlet 0.1.0".into(),
            emulation_version: "1.37".into(),
            paths: aggregate_paths(&["/metrics/probes", "/healthz/ping", "/configz", "/metrics"]),
        }
    }

    fn flags() -> BTreeMap<String, String> {
        [("port", "10250"), ("node-ip", "10.0.0.1"), ("config", "")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ask(content: Content<'_>, accept: &str) -> Reply {
        let req = Request {
            accept: Some(accept),
            ..Request::default()
        };
        respond(content, req, ":")
    }

    #[test]
    fn statusz_text_has_the_kubelets_layout() {
        let now = at("2026-05-05T11:02:03.9Z");
        assert_eq!(
            // A space follows the delimiter, as in the kubelet's layout.
            statusz_text(&status(), now, ":"),
            "\nkubelet statusz\n\
             Warning: This endpoint is not meant to be machine parseable, has no formatting \
             compatibility guarantees and is for debugging purposes only.\n\
             \n\
             Started: Tue May  5 10:00:00 UTC 2026\n\
             Up: 1 hr 02 min 03 sec\n\
             Go version: rustc 1.90.0\n\
             Binary version: rustlet 0.1.0\n\
             Emulation version: 1.37\n\
             Paths: /configz /healthz /metrics\n"
        );
        let bare = Status {
            emulation_version: String::new(),
            paths: Vec::new(),
            go_version: "a<b".into(),
            ..status()
        };
        let text = statusz_text(&bare, now, "=");
        assert!(text.contains("\nGo version= a&lt;b\n"), "{text}");
        assert!(text.ends_with("rustlet 0.1.0\n\n\n"), "{text}");
    }

    #[test]
    fn flagz_text_lists_flags_by_name() {
        assert_eq!(
            flagz_text(&flags(), "="),
            format!("\nkubelet flagz\n{WARNING}\nconfig=\nnode-ip=10.0.0.1\nport=10250\n")
        );
    }

    #[test]
    fn paths_are_first_segments_once_without_discovery_roots() {
        assert_eq!(
            aggregate_paths(&[
                "/metrics/cadvisor",
                "/apis/x",
                "/",
                "/healthz",
                "/metrics",
                "/configz"
            ]),
            ["/configz", "/healthz", "/metrics"]
        );
        assert_eq!(emulation_version("v1.37.0"), "1.37");
        assert_eq!(emulation_version("1.38.1-rc.0"), "1.38");
    }

    #[test]
    fn the_start_is_cut_to_whole_seconds_and_uptime_never_negative() {
        let s = Status::new(at("2026-05-05T10:00:00.75Z"), &["/flagz"]);
        assert_eq!(s.started, at("2026-05-05T10:00:00Z"));
        assert_eq!(s.paths, ["/flagz"]);
        assert!(s.binary_version.starts_with("rustlet "));
        assert_eq!(s.emulation_version, "1.37");
        assert!(!s.go_version.is_empty());
        assert_eq!(uptime_seconds(s.started, at("2026-05-05T09:00:00Z")), 0);
        assert!(DELIMITERS.contains(&random_delimiter()));
    }

    #[test]
    fn text_is_the_default_and_what_text_or_wildcards_get() {
        let s = status();
        let now = at("2026-05-05T10:00:05Z");
        for accept in [
            "",
            "  ",
            "text/plain",
            "text/*",
            "*/*",
            "*",
            "application/json, */*",
        ] {
            let r = ask(Content::Statusz(&s, now), accept);
            assert_eq!(r.status, StatusCode::OK, "{accept:?}");
            assert_eq!(r.content_type, "text/plain; charset=utf-8", "{accept:?}");
            assert!(r.body.starts_with("\nkubelet statusz\n"), "{accept:?}");
        }
        let r = respond(Content::Flagz(&flags()), Request::default(), " ");
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.body.ends_with("node-ip 10.0.0.1\nport 10250\n"));
    }

    #[test]
    fn statusz_json_has_the_v1beta1_fields_in_order() {
        let s = status();
        let r = ask(Content::Statusz(&s, at("2026-05-05T10:00:42Z")), BETA);
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.content_type,
            "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"
        );
        assert_eq!(r.warning, None);
        assert_eq!(
            r.body,
            "{\"kind\":\"Statusz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\
             \"metadata\":{\"name\":\"kubelet\"},\"startTime\":\"2026-05-05T10:00:00Z\",\
             \"uptimeSeconds\":42,\"goVersion\":\"rustc 1.90.0\",\
             \"binaryVersion\":\"rustlet 0.1.0\",\"emulationVersion\":\"1.37\",\
             \"paths\":[\"/configz\",\"/healthz\",\"/metrics\"]}\n"
        );
    }

    #[test]
    fn v1alpha1_is_served_with_a_deprecation_warning() {
        let r = ask(
            Content::Flagz(&flags()),
            "application/json;g=config.k8s.io;v=v1alpha1;as=Flagz",
        );
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.warning.as_deref(),
            Some(
                "299 - \"This version of the flagz endpoint is deprecated. Please use a newer version.\""
            )
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["apiVersion"], "config.k8s.io/v1alpha1");
        assert_eq!(v["flags"]["node-ip"], "10.0.0.1");
    }

    #[test]
    fn flagz_json_and_yaml() {
        let r = ask(
            Content::Flagz(&flags()),
            "application/json;as=Flagz;v=v1beta1;g=config.k8s.io",
        );
        assert_eq!(
            r.body,
            "{\"kind\":\"Flagz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\
             \"metadata\":{\"name\":\"kubelet\"},\
             \"flags\":{\"config\":\"\",\"node-ip\":\"10.0.0.1\",\"port\":\"10250\"}}\n"
        );
        let none = BTreeMap::new();
        let r = ask(
            Content::Flagz(&none),
            "application/json;as=Flagz;v=v1beta1;g=config.k8s.io",
        );
        assert!(!r.body.contains("flags"), "{}", r.body);
        let r = ask(
            Content::Flagz(&flags()),
            "application/yaml;as=Flagz;v=v1beta1;g=config.k8s.io",
        );
        assert_eq!(
            r.content_type,
            "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz"
        );
        let v: serde_json::Value = serde_saphyr::from_str(&r.body).unwrap();
        assert_eq!(v["kind"], "Flagz");
        assert!(
            r.body
                .starts_with("apiVersion: config.k8s.io/v1beta1\nflags:\n")
        );
    }

    #[test]
    fn pretty_json_for_the_query_the_parameter_or_curl() {
        let s = status();
        let now = at("2026-05-05T10:00:00Z");
        let pretty = |req: Request<'_>| {
            respond(Content::Statusz(&s, now), req, ":")
                .body
                .starts_with("{\n  \"kind\": \"Statusz\",")
        };
        let req = Request {
            accept: Some(BETA),
            ..Request::default()
        };
        assert!(!pretty(req));
        assert!(pretty(Request {
            query: Some("pretty=true"),
            ..req
        }));
        assert!(pretty(Request {
            user_agent: Some("curl/8.5.0"),
            ..req
        }));
        assert!(!pretty(Request {
            user_agent: Some("curl/8.5.0"),
            query: Some("pretty=0"),
            ..req
        }));
        assert!(pretty(Request {
            accept: Some("application/json;pretty=1;as=Statusz;v=v1beta1;g=config.k8s.io"),
            ..req
        }));
    }

    #[test]
    fn unsupported_accept_is_406_with_a_status() {
        let s = status();
        let now = at("2026-05-05T10:00:00Z");
        let message = "only the following media types are accepted: \
                       application/json, application/yaml, text/plain";
        // JSON without a conversion: the Status as the codec writes it.
        let r = ask(Content::Statusz(&s, now), "application/json");
        assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(r.content_type, "application/json");
        assert_eq!(
            r.body,
            format!(
                "{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{{}},\
                 \"status\":\"Failure\",\"message\":\"{message}\",\
                 \"reason\":\"NotAcceptable\",\"code\":406}}\n"
            )
        );
        // Nothing acceptable even for the Status: indented JSON.
        for accept in [
            "application/xml",
            "application/json;as=Flagz;v=v1beta1;g=config.k8s.io",
            "application/json;as=Statusz;v=v1;g=config.k8s.io",
            "application/json;as=Statusz;v=v1beta1",
            "text/plain;as=Statusz;v=v1beta1;g=config.k8s.io",
            "application/vnd.kubernetes.protobuf",
            "text/plain;sv=v1",
        ] {
            let r = ask(Content::Statusz(&s, now), accept);
            assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE, "{accept}");
            assert_eq!(r.content_type, "application/json", "{accept}");
            assert!(
                r.body.starts_with("{\n  \"kind\": \"Status\",\n"),
                "{accept}"
            );
            assert!(r.body.ends_with("\"code\": 406\n}"), "{accept}");
        }
        let r = ask(Content::Flagz(&flags()), "application/yaml");
        assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(r.content_type, "application/yaml");
        let v: serde_json::Value = serde_saphyr::from_str(&r.body).unwrap();
        assert_eq!(v["reason"], "NotAcceptable");
        assert_eq!(v["message"], message);
    }

    #[test]
    fn accept_clauses_are_ordered_as_goautoneg_orders_them() {
        let c = parse_accept("*/*;q=0.5, text/plain;q=0.1, application/json;as=Statusz;q=0.9");
        let order: Vec<_> = c.iter().map(|c| (c.ty, c.sub)).collect();
        // text/plain goes before */* although its q is lower: the comparison
        // prefers a concrete type whatever the q.
        assert_eq!(
            order,
            [("application", "json"), ("text", "plain"), ("*", "*")]
        );
        assert_eq!(c[0].params.get("as"), Some(&"Statusz"));
        let c = parse_accept("text, a/b/c, text/plain;x;y=1=2;z = 3, */*;q=x");
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].params.len(), 1);
        assert_eq!(c[0].params.get("z"), Some(&"3"));
        assert!(c[1].q.abs() < f64::EPSILON);
        // JSON before YAML on `application/*` with a conversion.
        let r = ask(
            Content::Flagz(&flags()),
            "application/*;as=Flagz;v=v1beta1;g=config.k8s.io",
        );
        assert!(r.content_type.starts_with("application/json;"));
        // Many clauses still negotiate.
        let long = vec!["application/xml"; 20].join(",") + ", text/plain";
        assert_eq!(ask(Content::Flagz(&flags()), &long).status, StatusCode::OK);
    }

    #[test]
    fn json_escapes_html_characters_as_go_does() {
        let mut f = flags();
        f.insert("x".into(), "<a&b>".into());
        let r = ask(
            Content::Flagz(&f),
            "application/json;as=Flagz;v=v1beta1;g=config.k8s.io",
        );
        assert!(
            r.body.contains("\"x\":\"\\u003ca\\u0026b\\u003e\""),
            "{}",
            r.body
        );
    }
}

//! Container logs as the kubelet serves them on `/containerLogs/{ns}/{pod}/{container}`:
//! the CRI log file format, the `PodLogOptions` query, which restart's file to read,
//! and the reader that applies tail, since, limit and timestamps and follows the file.
//!
//! Semantics come from the kubelet: `getContainerLogs` in pkg/kubelet/server/server.go
//! (query decoding and validation), `validateContainerLogStatus` in
//! pkg/kubelet/kubelet_pods.go (which container's log, and the errors when there is
//! none), and `ReadLogs` in k8s.io/cri-client/pkg/logs (format, tail, partial lines,
//! follow). Like the kubelet, rotated files (`<n>.log.<timestamp>`) are not read.

use std::io::{self, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ContainerStatus;
use k8s_openapi::jiff::Timestamp;

use tokio::io::{AsyncBufReadExt as _, AsyncSeekExt as _};

use crate::cri::log::{LogMessage, Stream, format_timestamp};
use crate::reasons::waiting;

pub use crate::cri::log::tail_start;

/// The streams a request asks for (`stream` query parameter: `All`, `Stdout`, `Stderr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamSelector {
    /// Both streams, interleaved as written (the default).
    #[default]
    All,
    /// Standard output only.
    Stdout,
    /// Standard error only.
    Stderr,
}

impl StreamSelector {
    fn wants(self, s: Stream) -> bool {
        matches!(
            (self, s),
            (Self::All, _) | (Self::Stdout, Stream::Stdout) | (Self::Stderr, Stream::Stderr)
        )
    }
}

/// The kubelet's log options, decoded from a `PodLogOptions` query and validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep streaming new lines until the container stops or the client goes.
    pub follow: bool,
    /// Read the previous (last terminated) instance of the container.
    pub previous: bool,
    /// Prefix every line with its RFC3339 timestamp (nanoseconds, fixed width).
    pub timestamps: bool,
    /// Lines from the end of the file to start at (`None`: the whole file).
    pub tail_lines: Option<u64>,
    /// Bytes to send at most (`None`: no limit; at least 1).
    pub limit_bytes: Option<u64>,
    /// Lines older than this are skipped (from `sinceSeconds` or `sinceTime`).
    pub since: Option<Timestamp>,
    /// The streams asked for.
    pub stream: StreamSelector,
}

/// Why a log request's query was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A value does not parse (the kubelet answers 400 `{"message": "Unable to decode query."}`).
    #[error("unable to decode query: {0}")]
    Decode(String),
    /// Values parse but are invalid together or alone (the kubelet answers 422
    /// `{"message": "Invalid request."}`).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// An unknown `stream` (400 `invalid stream type`).
    #[error("invalid stream type {0:?}")]
    Stream(String),
}

/// Go's query conversion of a boolean: absent or `0`/`false` (any case) is false,
/// anything else true (`runtime.Convert_Slice_string_To_bool`).
fn query_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

fn query_int(key: &str, v: &str) -> Result<i64, OptionsError> {
    v.parse()
        .map_err(|_| OptionsError::Decode(format!("{key}: {v:?} is not an integer")))
}

impl LogOptions {
    /// Decodes and validates a raw query string (`follow=true&tailLines=10`) as the
    /// kubelet does for `PodLogOptions` v1, with `now` as the time `sinceSeconds`
    /// counts back from. The legacy `tail` parameter is honoured (`tail=all` means
    /// no tail). When a parameter repeats, its first value counts.
    ///
    /// # Errors
    /// [`OptionsError::Decode`] for an unparseable number or time,
    /// [`OptionsError::Invalid`] for a negative `tailLines`, `limitBytes` or
    /// `sinceSeconds` below 1, both `sinceSeconds` and `sinceTime`, or `tailLines`
    /// with a single stream; [`OptionsError::Stream`] for an unknown `stream`.
    pub fn from_query(query: &str, now: Timestamp) -> Result<Self, OptionsError> {
        let mut first = std::collections::HashMap::<String, String>::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            first
                .entry(k.into_owned())
                .or_insert_with(|| v.into_owned());
        }
        if let Some(tail) = first.remove("tail") {
            if tail == "all" {
                first.remove("tailLines");
            } else {
                first.insert("tailLines".into(), tail);
            }
        }
        let get = |k: &str| first.get(k).map(String::as_str);
        let mut o = Self {
            follow: get("follow").is_some_and(query_bool),
            previous: get("previous").is_some_and(query_bool),
            timestamps: get("timestamps").is_some_and(query_bool),
            ..Self::default()
        };
        let tail = get("tailLines")
            .map(|v| query_int("tailLines", v))
            .transpose()?;
        let limit = get("limitBytes")
            .map(|v| query_int("limitBytes", v))
            .transpose()?;
        let since_seconds = get("sinceSeconds")
            .map(|v| query_int("sinceSeconds", v))
            .transpose()?;
        let since_time = match get("sinceTime") {
            None | Some("") => None,
            Some(v) => Some(v.parse::<Timestamp>().map_err(|e| {
                OptionsError::Decode(format!("sinceTime: {v:?} is not an RFC3339 time: {e}"))
            })?),
        };
        if let Some(n) = tail {
            o.tail_lines = Some(
                u64::try_from(n)
                    .map_err(|_| OptionsError::Invalid(format!("tailLines: {n}: must be >= 0")))?,
            );
        }
        if let Some(n) = limit {
            if n < 1 {
                return Err(OptionsError::Invalid(format!(
                    "limitBytes: {n}: must be greater than 0"
                )));
            }
            o.limit_bytes = u64::try_from(n).ok();
        }
        match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(OptionsError::Invalid(
                    "at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
                ));
            }
            (Some(s), None) if s < 1 => {
                return Err(OptionsError::Invalid(format!(
                    "sinceSeconds: {s}: must be greater than 0"
                )));
            }
            (Some(s), None) => {
                o.since = Some(
                    now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                        .unwrap_or(Timestamp::MIN),
                );
            }
            (None, t) => o.since = t,
        }
        o.stream = match get("stream") {
            None | Some("All") => StreamSelector::All,
            Some("Stdout") => StreamSelector::Stdout,
            Some("Stderr") => StreamSelector::Stderr,
            Some(other) => return Err(OptionsError::Stream(other.to_string())),
        };
        if o.stream != StreamSelector::All && o.tail_lines.is_some() {
            return Err(OptionsError::Invalid(
                "`tailLines` and specific `stream` are mutually exclusive for now".into(),
            ));
        }
        Ok(o)
    }
}

/// Applies since, stream selection, timestamps and the byte limit to parsed lines
/// (the runtime's `logWriter`).
#[derive(Debug)]
pub struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    stream: StreamSelector,
    remain: Option<u64>,
    new_line: bool,
}

/// What the reader does after a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Go on.
    More,
    /// The byte limit is reached: stop.
    Done,
}

impl LogWriter {
    /// A writer for `opts`.
    #[must_use]
    pub fn new(opts: &LogOptions) -> Self {
        Self {
            since: opts.since,
            timestamps: opts.timestamps,
            stream: opts.stream,
            remain: opts.limit_bytes,
            new_line: true,
        }
    }

    /// Appends what `msg` contributes to the output onto `out`: nothing if it is
    /// older than `since` or of a stream not asked for; with a timestamp prefix if
    /// asked and the line starts a new line (a partial line's continuation gets
    /// none); cut at the byte limit.
    pub fn write(&mut self, msg: &LogMessage<'_>, out: &mut Vec<u8>) -> Next {
        let prefix = self.new_line;
        self.new_line = msg.content.last().is_none_or(|b| *b == b'\n');
        if self.since.is_some_and(|s| msg.timestamp < s) || !self.stream.wants(msg.stream) {
            return Next::More;
        }
        let mut line = Vec::new();
        if self.timestamps && prefix {
            line.extend_from_slice(format_timestamp(msg.timestamp, msg.offset).as_bytes());
            line.push(b' ');
        }
        line.extend_from_slice(&msg.content);
        match &mut self.remain {
            None => {
                out.extend_from_slice(&line);
                Next::More
            }
            Some(remain) => {
                let n = usize::try_from(*remain)
                    .unwrap_or(usize::MAX)
                    .min(line.len());
                out.extend_from_slice(&line[..n]);
                *remain -= n as u64;
                if *remain == 0 { Next::Done } else { Next::More }
            }
        }
    }
}

/// Where the output goes: a client that may go away.
pub trait LogSink: Send {
    /// Sends a chunk, waiting while the client is behind; false when the
    /// client is gone.
    fn send(&mut self, chunk: Vec<u8>) -> impl Future<Output = bool> + Send;
    /// True when the client is gone.
    fn is_closed(&self) -> bool;
}

impl LogSink for Vec<u8> {
    async fn send(&mut self, chunk: Vec<u8>) -> bool {
        self.extend_from_slice(&chunk);
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl LogSink for tokio::sync::mpsc::Sender<bytes::Bytes> {
    async fn send(&mut self, chunk: Vec<u8>) -> bool {
        tokio::sync::mpsc::Sender::send(self, chunk.into())
            .await
            .is_ok()
    }
    fn is_closed(&self) -> bool {
        tokio::sync::mpsc::Sender::is_closed(self)
    }
}

/// Output is sent in chunks of about this many bytes (and whenever the reader waits).
const CHUNK: usize = 32 * 1024;

/// An open container log file, positioned where the options say reading starts.
pub struct LogReader {
    path: PathBuf,
    reader: tokio::io::BufReader<tokio::fs::File>,
    opts: LogOptions,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LogReader {
    /// Opens `path` and seeks to the start of the last `tail_lines` lines.
    ///
    /// # Errors
    /// The file cannot be opened, sought or read.
    pub async fn open(path: &Path, opts: LogOptions) -> io::Result<Self> {
        let tail = opts.tail_lines;
        let owned = path.to_path_buf();
        // One short blocking step: open and find where the tail starts.
        let f = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::open(&owned)?;
            let start = match tail {
                Some(n) => tail_start(&mut f, n)?,
                None => 0,
            };
            f.seek(SeekFrom::Start(start))?;
            Ok::<_, io::Error>(f)
        })
        .await
        .map_err(io::Error::other)??;
        Ok(Self {
            path: path.to_path_buf(),
            reader: tokio::io::BufReader::new(tokio::fs::File::from_std(f)),
            opts,
        })
    }

    /// True when the path now names another file than the one being read
    /// (the log manager renamed it and the runtime reopened a new one).
    async fn rotated(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match (
            tokio::fs::metadata(&self.path).await,
            self.reader.get_ref().metadata().await,
        ) {
            (Ok(now), Ok(open)) => (now.dev(), now.ino()) != (open.dev(), open.ino()),
            _ => false,
        }
    }

    /// Reads lines into `sink` until the end of the file; with `follow`, until
    /// `running()` says the container stopped and what it wrote last is read, or
    /// the client is gone. `poll` is how often a followed file is checked for new
    /// lines; a followed file that is rotated is followed into its successor.
    /// Runs on the async runtime: file reads are short blocking steps and the
    /// waits between polls hold no thread. Lines that do not parse are
    /// logged and skipped.
    ///
    /// # Errors
    /// I/O errors reading the file.
    pub async fn run<S: LogSink>(
        mut self,
        sink: &mut S,
        running: &(dyn Fn() -> bool + Send + Sync),
        poll: Duration,
    ) -> io::Result<()> {
        let limited = self.opts.tail_lines.is_some() && !self.opts.follow;
        let mut left = self.opts.tail_lines.unwrap_or(0);
        let mut writer = LogWriter::new(&self.opts);
        let mut out = Vec::with_capacity(CHUNK);
        let mut line = Vec::new();
        let mut alive = true;
        let mut json: Option<bool> = None;
        loop {
            if limited && left == 0 {
                break;
            }
            line.clear();
            self.reader.read_until(b'\n', &mut line).await?;
            let mut last = false;
            if !line.ends_with(b"\n") {
                if self.opts.follow {
                    // Stopped, and everything it wrote is read.
                    if !alive {
                        break;
                    }
                    // Read an incomplete line again once it is complete.
                    let back = i64::try_from(line.len()).unwrap_or(i64::MAX);
                    self.reader.seek(SeekFrom::Current(-back)).await?;
                    if !out.is_empty() && !sink.send(std::mem::take(&mut out)).await {
                        return Ok(());
                    }
                    // The live file was rotated away: go on in the new one,
                    // as the kubelet's follow does.
                    if self.rotated().await
                        && let Ok(f) = tokio::fs::File::open(&self.path).await
                    {
                        self.reader = tokio::io::BufReader::new(f);
                        continue;
                    }
                    alive = running();
                    if alive {
                        if sink.is_closed() {
                            return Ok(());
                        }
                        tokio::time::sleep(poll).await;
                    }
                    continue;
                }
                if line.is_empty() {
                    break;
                }
                tracing::debug!(path = %self.path.display(), "incomplete last line in log file");
                last = true;
            }
            let is_json = *json.get_or_insert_with(|| crate::cri::log::is_json(&line));
            let parsed = crate::cri::log::parse_line(&line, is_json);
            match parsed {
                Ok(msg) => {
                    if writer.write(&msg, &mut out) == Next::Done {
                        break;
                    }
                    left = left.saturating_sub(1);
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "skipping log line");
                }
            }
            if out.len() >= CHUNK && !sink.send(std::mem::take(&mut out)).await {
                return Ok(());
            }
            if last {
                break;
            }
        }
        if !out.is_empty() {
            sink.send(out).await;
        }
        Ok(())
    }
}

/// Which of a container's log files a request reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The newest file (highest restart number).
    Newest,
    /// The one before it.
    SecondNewest,
}

fn terminated_id(s: Option<&k8s_openapi::api::core::v1::ContainerStateTerminated>) -> bool {
    s.and_then(|t| t.container_id.as_deref())
        .is_some_and(|id| !id.is_empty())
}

/// Picks the log file of `container` in pod `pod` from its status, as the
/// kubelet's `validateContainerLogStatus` picks a container: `previous` reads the
/// last terminated instance; otherwise the running one, else the terminated one,
/// else the last terminated one. Files are numbered by restart, so the current
/// instance's file is the newest and the last terminated one's the file before it
/// (or the newest, when no current instance has started).
///
/// # Errors
/// The kubelet's messages: `container "c" in pod "p" is not available`,
/// `previous terminated container "c" in pod "p" not found`,
/// `container "c" in pod "p" is terminated`,
/// `container "c" in pod "p" is waiting to start: <reason>`.
pub fn pick(
    status: Option<&ContainerStatus>,
    container: &str,
    pod: &str,
    previous: bool,
) -> Result<Which, String> {
    let Some(cs) = status else {
        return Err(format!(
            "container {container:?} in pod {pod:?} is not available"
        ));
    };
    let state = cs.state.clone().unwrap_or_default();
    let last = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let current_started = state.running.is_some() || terminated_id(state.terminated.as_ref());
    let newest_unless_current = if current_started {
        Which::SecondNewest
    } else {
        Which::Newest
    };
    if previous {
        return if terminated_id(last) {
            Ok(newest_unless_current)
        } else {
            Err(format!(
                "previous terminated container {container:?} in pod {pod:?} not found"
            ))
        };
    }
    if state.running.is_some() || terminated_id(state.terminated.as_ref()) {
        return Ok(Which::Newest);
    }
    if state.terminated.is_some() || last.is_some() {
        return if terminated_id(last) {
            Ok(Which::Newest)
        } else {
            Err(format!(
                "container {container:?} in pod {pod:?} is terminated"
            ))
        };
    }
    if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        let why = match reason {
            waiting::ERR_IMAGE_PULL => "image can't be pulled".to_string(),
            waiting::IMAGE_PULL_BACK_OFF => "trying and failing to pull image".to_string(),
            r => r.to_string(),
        };
        return Err(format!(
            "container {container:?} in pod {pod:?} is waiting to start: {why}"
        ));
    }
    Err(format!(
        "container {container:?} in pod {pod:?} is waiting to start - no logs yet"
    ))
}

/// The restart numbers of the log files in a container's log directory
/// (`<n>.log`), newest first. A missing directory has none.
#[must_use]
pub fn restarts(dir: &Path) -> Vec<u32> {
    let mut found: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
        .collect();
    found.sort_unstable_by(|a, b| b.cmp(a));
    found
}

/// True when a later instance than restart `restart` has a log file in
/// `dir`: the instance being followed was replaced. The live file missing
/// (the log manager renamed it and the runtime is reopening it) is not
/// that: rotation ends no follow.
#[must_use]
pub fn superseded(dir: &Path, restart: u32) -> bool {
    restarts(dir)
        .first()
        .is_some_and(|newest| *newest > restart)
}

/// The file `which` names among `restarts` (newest first): its restart number
/// and its path in `dir`.
#[must_use]
pub fn file_for(dir: &Path, restarts: &[u32], which: Which) -> Option<(u32, PathBuf)> {
    let i = match which {
        Which::Newest => 0,
        Which::SecondNewest => 1,
    };
    restarts.get(i).map(|n| (*n, dir.join(format!("{n}.log"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    };

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().unwrap()
    }

    fn opts(q: &str) -> LogOptions {
        LogOptions::from_query(q, now()).unwrap()
    }

    #[test]
    fn only_a_later_instance_supersedes_the_followed_one() {
        let dir = tempfile::tempdir().unwrap();
        let touch = |name: &str| std::fs::write(dir.path().join(name), b"").unwrap();
        // Between the rotation's rename and the runtime's reopen, only
        // rotated files are there.
        touch("0.log.20261129-170824");
        touch("0.log.20261129-170814.gz");
        assert!(!superseded(dir.path(), 0));
        touch("0.log");
        assert!(!superseded(dir.path(), 0));
        touch("1.log");
        assert!(superseded(dir.path(), 0));
        assert!(!superseded(dir.path(), 1));
    }

    #[test]
    fn query_decodes_like_the_kubelet() {
        assert_eq!(opts(""), LogOptions::default());
        let o = opts("follow=true&previous=1&timestamps=yes&tailLines=10&limitBytes=5");
        assert!(o.follow && o.previous && o.timestamps);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(10), Some(5)));
        assert!(!opts("follow=false&previous=0&timestamps=FALSE").follow);
        // Legacy `tail`, and `tail=all`.
        assert_eq!(opts("tail=3").tail_lines, Some(3));
        assert_eq!(opts("tailLines=3&tail=all").tail_lines, None);
        // sinceSeconds counts back from now; sinceTime is taken as is.
        assert_eq!(
            opts("sinceSeconds=60").since,
            Some("2024-05-01T11:59:00Z".parse().unwrap())
        );
        assert_eq!(
            opts("sinceTime=2024-05-01T10%3A00%3A00%2B02%3A00").since,
            Some("2024-05-01T08:00:00Z".parse().unwrap())
        );
        assert_eq!(opts("stream=Stderr").stream, StreamSelector::Stderr);
    }

    #[test]
    fn bad_queries_are_refused_as_the_kubelet_refuses_them() {
        let err = |q: &str| LogOptions::from_query(q, now()).unwrap_err();
        assert!(matches!(err("tailLines=x"), OptionsError::Decode(_)));
        assert!(matches!(
            err("sinceTime=yesterday"),
            OptionsError::Decode(_)
        ));
        assert!(matches!(err("tailLines=-1"), OptionsError::Invalid(_)));
        assert!(matches!(err("limitBytes=0"), OptionsError::Invalid(_)));
        assert!(matches!(err("sinceSeconds=0"), OptionsError::Invalid(_)));
        assert!(matches!(
            err("sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z"),
            OptionsError::Invalid(_)
        ));
        assert!(matches!(
            err("stream=Stdout&tailLines=1"),
            OptionsError::Invalid(_)
        ));
        assert_eq!(err("stream=both"), OptionsError::Stream("both".into()));
    }

    #[test]
    fn extreme_query_numbers_are_taken_or_refused_never_wrapped() {
        let max = i64::MAX;
        let o = opts(&format!("tailLines={max}&limitBytes={max}"));
        assert_eq!(
            (o.tail_lines, o.limit_bytes),
            (Some(max as u64), Some(max as u64))
        );
        // Counting back past the first timestamp: everything.
        assert_eq!(
            opts(&format!("sinceSeconds={max}")).since,
            Some(Timestamp::MIN)
        );
        let err = |q: &str| LogOptions::from_query(q, now()).unwrap_err();
        for q in [
            format!("tailLines={}", i64::MIN),
            format!("limitBytes={}", i64::MIN),
            format!("sinceSeconds={}", i64::MIN),
            "limitBytes=-1".into(),
            "sinceSeconds=-1".into(),
        ] {
            assert!(matches!(err(&q), OptionsError::Invalid(_)), "{q}");
        }
        for q in [
            "tailLines=9223372036854775808",
            "limitBytes=1e3",
            "sinceSeconds=+-1",
        ] {
            assert!(matches!(err(q), OptionsError::Decode(_)), "{q}");
        }
        // The tail of a file shorter than asked for is all of it.
        let mut f = io::Cursor::new(b"a\nb\n".to_vec());
        assert_eq!(tail_start(&mut f, u64::MAX).unwrap(), 0);
        assert_eq!(tail_start(&mut f, 0).unwrap(), 4);
    }

    const LOG: &str = "\
2024-05-01T11:00:00.000000001Z stdout F one
2024-05-01T11:30:00.000000002Z stderr F two
2024-05-01T11:45:00Z stdout P thr
2024-05-01T11:45:01Z stdout F ee
2024-05-01T11:59:30Z stdout F four
";

    async fn read(text: &str, q: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, text).unwrap();
        let mut out = Vec::new();
        LogReader::open(&path, opts(q))
            .await
            .unwrap()
            .run(&mut out, &|| false, Duration::from_millis(1))
            .await
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn options_shape_the_output() {
        assert_eq!(read(LOG, "").await, "one\ntwo\nthree\nfour\n");
        // tailLines counts lines of the file: a partial line is one.
        assert_eq!(read(LOG, "tailLines=1").await, "four\n");
        assert_eq!(read(LOG, "tailLines=2").await, "ee\nfour\n");
        assert_eq!(read(LOG, "tailLines=3").await, "three\nfour\n");
        assert_eq!(read(LOG, "tailLines=0").await, "");
        assert_eq!(read(LOG, "tailLines=100").await, "one\ntwo\nthree\nfour\n");
        assert_eq!(read(LOG, "limitBytes=6").await, "one\ntw");
        assert_eq!(read(LOG, "sinceSeconds=1800").await, "two\nthree\nfour\n");
        assert_eq!(
            read(LOG, "sinceTime=2024-05-01T11:45:01Z").await,
            "ee\nfour\n"
        );
        assert_eq!(read(LOG, "stream=Stderr").await, "two\n");
        assert_eq!(
            read(LOG, "timestamps=true&tailLines=3").await,
            "2024-05-01T11:45:00.000000000Z three\n2024-05-01T11:59:30.000000000Z four\n"
        );
        // A bad line is skipped; an incomplete last line is read.
        assert_eq!(
            read(
                "2024-05-01T11:00:00Z stdout F a\nnonsense\n2024-05-01T11:00:00Z stdout F b",
                ""
            )
            .await,
            "a\nb"
        );
    }

    #[tokio::test]
    async fn follow_streams_until_the_container_stops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(
            &path,
            "2024-05-01T11:00:00Z stdout F a\n2024-05-01T11:00:00Z stdout P b",
        )
        .unwrap();
        let reader = LogReader::open(&path, opts("follow=true&tailLines=1"))
            .await
            .unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                std::io::Write::write_all(&mut f, b"\n2024-05-01T11:00:01Z stdout F c\n").unwrap();
            })
        };
        // "Running" until the writer is done, then stopped.
        let running = || !writer.is_finished();
        let mut out = Vec::new();
        reader
            .run(&mut out, &running, Duration::from_millis(5))
            .await
            .unwrap();
        // tailLines=1 starts at the last complete line; the partial line, once
        // complete, is joined with the next.
        assert_eq!(String::from_utf8(out).unwrap(), "a\nbc\n");
    }

    #[tokio::test]
    async fn follow_goes_on_in_the_new_file_after_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2024-05-01T11:00:00Z stdout F before\n").unwrap();
        let reader = LogReader::open(&path, opts("follow=true")).await.unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                std::fs::rename(&path, path.with_extension("log.20240501-110001")).unwrap();
                std::fs::write(&path, "2024-05-01T11:00:02Z stdout F after\n").unwrap();
                std::thread::sleep(Duration::from_millis(50));
            })
        };
        let running = || !writer.is_finished();
        let mut out = Vec::new();
        reader
            .run(&mut out, &running, Duration::from_millis(5))
            .await
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "before\nafter\n");
    }

    #[tokio::test]
    async fn follow_ends_when_the_client_goes() {
        struct Gone;
        impl LogSink for Gone {
            async fn send(&mut self, _: Vec<u8>) -> bool {
                false
            }
            fn is_closed(&self) -> bool {
                true
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "").unwrap();
        LogReader::open(&path, opts("follow=true"))
            .await
            .unwrap()
            .run(&mut Gone, &|| true, Duration::from_millis(1))
            .await
            .unwrap();
    }

    fn status(state: ContainerState, last: Option<ContainerStateTerminated>) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            state: Some(state),
            last_state: last.map(|t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }
    }

    fn terminated(id: &str) -> ContainerStateTerminated {
        ContainerStateTerminated {
            container_id: Some(id.into()),
            ..Default::default()
        }
    }

    fn waiting(reason: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_file_is_picked_from_the_status_as_the_kubelet_picks_a_container() {
        let t = |id: &str| terminated(id);
        type Case = (
            &'static str,
            Option<ContainerStatus>,
            bool,
            Result<Which, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "no status",
                None,
                false,
                Err("container \"c\" in pod \"p\" is not available"),
            ),
            (
                "running",
                Some(status(running(), None)),
                false,
                Ok(Which::Newest),
            ),
            (
                "running, previous without one",
                Some(status(running(), None)),
                true,
                Err("previous terminated container \"c\" in pod \"p\" not found"),
            ),
            (
                "running after a restart, previous",
                Some(status(running(), Some(t("containerd://1")))),
                true,
                Ok(Which::SecondNewest),
            ),
            (
                "crash loop back-off: the last run is the newest file",
                Some(status(
                    waiting("CrashLoopBackOff"),
                    Some(t("containerd://1")),
                )),
                false,
                Ok(Which::Newest),
            ),
            (
                "crash loop back-off, previous: the same file",
                Some(status(
                    waiting("CrashLoopBackOff"),
                    Some(t("containerd://1")),
                )),
                true,
                Ok(Which::Newest),
            ),
            (
                "terminated",
                Some(status(
                    ContainerState {
                        terminated: Some(t("containerd://2")),
                        ..Default::default()
                    },
                    None,
                )),
                false,
                Ok(Which::Newest),
            ),
            (
                "terminated without ID and no last state",
                Some(status(
                    ContainerState {
                        terminated: Some(ContainerStateTerminated::default()),
                        ..Default::default()
                    },
                    None,
                )),
                false,
                Err("container \"c\" in pod \"p\" is terminated"),
            ),
            (
                "image pull",
                Some(status(waiting("ErrImagePull"), None)),
                false,
                Err("container \"c\" in pod \"p\" is waiting to start: image can't be pulled"),
            ),
            (
                "creating",
                Some(status(waiting("ContainerCreating"), None)),
                false,
                Err("container \"c\" in pod \"p\" is waiting to start: ContainerCreating"),
            ),
            (
                "no state",
                Some(status(ContainerState::default(), None)),
                false,
                Err("container \"c\" in pod \"p\" is waiting to start - no logs yet"),
            ),
        ];
        for (name, st, previous, want) in cases {
            let got = pick(st.as_ref(), "c", "p", previous);
            assert_eq!(got, want.map_err(str::to_string), "{name}");
        }
    }

    #[test]
    fn restart_files_are_listed_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["0.log", "2.log", "10.log", "2.log.20240501-120000", "x.log"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let r = restarts(dir.path());
        assert_eq!(r, vec![10, 2, 0]);
        assert_eq!(
            file_for(dir.path(), &r, Which::SecondNewest),
            Some((2, dir.path().join("2.log")))
        );
        assert_eq!(file_for(dir.path(), &[], Which::Newest), None);
        assert!(restarts(&dir.path().join("missing")).is_empty());
    }
}

//! The container log file format of the CRI (`<RFC3339Nano> <stdout|stderr>
//! <F|P>[:tags] <content>`, and Docker's JSON lines), as the runtime writes it
//! and k8s.io/cri-client/pkg/logs reads it: parsing a line, and the kubelet's
//! timestamp format for `timestamps=true`. The node API's log reader and the
//! termination message's log fallback both read logs through it, and both
//! find the last lines of a file the same way ([`tail_start`]).

use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::Offset;

/// Which output stream a log line was written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The container's standard output.
    Stdout,
    /// The container's standard error.
    Stderr,
}

/// One parsed log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogMessage<'a> {
    /// When the runtime wrote it.
    pub timestamp: Timestamp,
    /// The offset the timestamp was written with (kept for `timestamps=true`).
    pub offset: Offset,
    /// Its stream.
    pub stream: Stream,
    /// Its content: with the trailing newline for a full line (`F`), without for a
    /// partial one (`P`), which the next line continues.
    pub content: std::borrow::Cow<'a, [u8]>,
}

/// Why a log line does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not `<time> <stream> <tag> <content>` nor a Docker JSON line.
    #[error("unsupported log line: {0}")]
    Format(String),
}

fn offset_of(ts: &str) -> Offset {
    // RFC3339 ends in `Z` or `±hh:mm`.
    if ts.ends_with(['Z', 'z']) || ts.len() < 6 {
        return Offset::UTC;
    }
    let Some(tail) = ts.get(ts.len() - 6..) else {
        return Offset::UTC;
    };
    let sign = match tail.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Offset::UTC,
    };
    let h: i32 = tail.get(1..3).and_then(|h| h.parse().ok()).unwrap_or(0);
    let m: i32 = tail.get(4..6).and_then(|m| m.parse().ok()).unwrap_or(0);
    Offset::from_seconds(sign * (h * 3600 + m * 60)).unwrap_or(Offset::UTC)
}

/// Parses a line of the CRI log format, `<RFC3339Nano> <stdout|stderr> <F|P>[:tags] <content>`
/// (the runtime's `parseCRILog`). `line` includes its trailing newline if it has one;
/// a partial line's newline is dropped.
///
/// # Errors
/// [`ParseError::Format`] naming the missing or bad field.
pub fn parse_cri_line(line: &[u8]) -> Result<LogMessage<'_>, ParseError> {
    let bad =
        |what: &str| ParseError::Format(format!("{what} in {:?}", String::from_utf8_lossy(line)));
    let mut parts = line.splitn(4, |b| *b == b' ');
    let ts = parts.next().ok_or_else(|| bad("no timestamp"))?;
    let ts = std::str::from_utf8(ts).map_err(|_| bad("bad timestamp"))?;
    let timestamp = Timestamp::from_str(ts).map_err(|_| bad("bad timestamp"))?;
    let stream = match parts.next() {
        Some(b"stdout") => Stream::Stdout,
        Some(b"stderr") => Stream::Stderr,
        _ => return Err(bad("no stream type")),
    };
    let tag = parts.next().ok_or_else(|| bad("no log tag"))?;
    let content = parts.next().ok_or_else(|| bad("no log tag"))?;
    // Tags are `:`-separated; the first is F (full) or P (partial).
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    let content = if partial {
        content.strip_suffix(b"\n").unwrap_or(content)
    } else {
        content
    };
    Ok(LogMessage {
        timestamp,
        offset: offset_of(ts),
        stream,
        content: content.into(),
    })
}

#[derive(serde::Deserialize)]
struct JsonLog {
    #[serde(default)]
    log: String,
    #[serde(default)]
    stream: String,
    time: String,
}

/// Parses a line of the Docker JSON log format,
/// `{"log":"content\n","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}`
/// (the runtime's `parseDockerJSONLog`).
///
/// # Errors
/// [`ParseError::Format`] when it is not such a line.
pub fn parse_json_line(line: &[u8]) -> Result<LogMessage<'static>, ParseError> {
    let bad = || ParseError::Format(String::from_utf8_lossy(line).into_owned());
    let l: JsonLog = serde_json::from_slice(line).map_err(|_| bad())?;
    let stream = match l.stream.as_str() {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return Err(bad()),
    };
    Ok(LogMessage {
        timestamp: Timestamp::from_str(&l.time).map_err(|_| bad())?,
        offset: offset_of(&l.time),
        stream,
        content: l.log.into_bytes().into(),
    })
}

/// Formats a timestamp as Go's `RFC3339NanoFixed`
/// (`2006-01-02T15:04:05.000000000Z07:00`) in the offset it was written with.
#[must_use]
pub fn format_timestamp(ts: Timestamp, offset: Offset) -> String {
    let dt = offset.to_datetime(ts);
    let zone = if offset.seconds() == 0 {
        "Z".to_string()
    } else {
        let s = offset.seconds();
        let sign = if s < 0 { '-' } else { '+' };
        let s = s.unsigned_abs();
        format!("{sign}{:02}:{:02}", s / 3600, s % 3600 / 60)
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}{zone}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.subsec_nanosecond()
    )
}

/// Parses a line of a log file in the format its first line showed: Docker
/// JSON when `json`, else CRI.
///
/// # Errors
/// [`ParseError::Format`] when the line is not in that format.
pub fn parse_line(line: &[u8], json: bool) -> Result<LogMessage<'_>, ParseError> {
    if json {
        parse_json_line(line)
    } else {
        parse_cri_line(line)
    }
}

/// Whether a log file whose first line is `line` is in the Docker JSON format
/// (`ReadLogs` picks the parser from the first line).
#[must_use]
pub fn is_json(line: &[u8]) -> bool {
    parse_cri_line(line).is_err() && parse_json_line(line).is_ok()
}

const TAIL_BLOCK: usize = 1024;

/// The byte offset where the last `n` complete lines of `f` start (the runtime's
/// `findTailLineStartIndex`): a trailing line without a newline is not counted,
/// and is read after them.
///
/// # Errors
/// I/O errors of seeking and reading.
pub fn tail_start<F: Read + Seek>(f: &mut F, n: u64) -> io::Result<u64> {
    let size = f.seek(SeekFrom::End(0))?;
    let mut right = size;
    let mut left = size;
    let mut count = 0u64;
    let mut buf = Vec::new();
    while right > 0 && count <= n {
        left = right.saturating_sub(TAIL_BLOCK as u64);
        let len = usize::try_from(right - left).unwrap_or(TAIL_BLOCK);
        buf.resize(len, 0);
        f.seek(SeekFrom::Start(left))?;
        f.read_exact(&mut buf)?;
        count += buf.iter().filter(|b| **b == b'\n').count() as u64;
        right = left;
    }
    // `buf` is the block at `left`; skip lines until `n` remain.
    let mut at = 0usize;
    while count > n {
        let idx = buf[at..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(buf.len() - at, |i| i + 1);
        at += idx;
        count -= 1;
    }
    Ok(left + at as u64)
}

/// Most bytes of a line's beginning [`tail_content`] keeps (its timestamp,
/// stream and tags are in them).
const LINE_HEAD: usize = 512;

/// Reads one line of `r` (through its newline, or to the end of the input)
/// into `line`, keeping only its first [`LINE_HEAD`] bytes and its last `tail`
/// bytes: memory stays bounded whatever the line's length. Returns the number
/// of bytes the line had (0 at the end of the input).
fn read_line_bounded<R: BufRead>(r: &mut R, line: &mut Vec<u8>, tail: usize) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(total);
        }
        let (n, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..n]);
        r.consume(n);
        total = total.saturating_add(n as u64);
        // Drop the middle once it is worth it: what is kept is never less
        // than the head and the last `tail` bytes.
        if line.len() > LINE_HEAD.saturating_add(tail.saturating_mul(2)) {
            let cut = line.len() - tail;
            line.drain(LINE_HEAD..cut);
        }
        if done {
            return Ok(total);
        }
    }
}

/// The content of the last `lines` lines of a container log (CRI or Docker
/// JSON format, stdout and stderr; a partial line's content without its
/// newline), at most its last `max` bytes: what the kubelet's
/// `readLastStringFromContainerLogs` reads for `FallbackToLogsOnError`
/// (`ReadLogs` with `tailLines` into a ring buffer). Reads from the end of
/// the file, never more than those lines, and holds at most about `max` bytes
/// plus one line's beginning in memory however long the lines are. Lines that
/// do not parse are skipped (a Docker JSON line longer than `max` plus its
/// beginning is one of them).
///
/// # Errors
/// I/O errors of seeking and reading.
pub fn tail_content<F: Read + Seek>(f: &mut F, lines: u64, max: usize) -> io::Result<Tail> {
    let end = f.seek(SeekFrom::End(0))?;
    let start = tail_start(f, lines)?;
    f.seek(SeekFrom::Start(start))?;
    // What was there when the read began: a file still growing is not chased.
    let mut r = BufReader::new(f.take(end.saturating_sub(start)));
    let mut out: Vec<u8> = Vec::new();
    let mut line = Vec::new();
    let mut json: Option<bool> = None;
    let mut left = lines;
    // One byte more than `max`: a partial line loses its newline.
    let keep = max.saturating_add(1);
    while left > 0 {
        line.clear();
        if read_line_bounded(&mut r, &mut line, keep)? == 0 {
            break;
        }
        let format_is_json = *json.get_or_insert_with(|| is_json(&line));
        let Ok(msg) = parse_line(&line, format_is_json) else {
            continue;
        };
        out.extend_from_slice(&msg.content);
        if out.len() > max.saturating_mul(2) {
            out.drain(..out.len() - max);
        }
        left -= 1;
    }
    if out.len() > max {
        out.drain(..out.len() - max);
    }
    Ok(Tail {
        content: out,
        lines: lines - left,
    })
}

/// The end of a log read by [`tail_content`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    /// The content of the lines read, at most the bytes asked for.
    pub content: Vec<u8>,
    /// How many lines of the file were taken: those that parse (a partial
    /// line counts as one); lines that do not parse are skipped uncounted.
    pub lines: u64,
}

/// The suffix of a rotated log the container log manager compressed.
pub const COMPRESSED_SUFFIX: &str = ".gz";
/// The suffix of a compressed log still being written.
pub const TMP_SUFFIX: &str = ".tmp";

/// The name a live log is rotated to at `now`: `<log>.<YYYYMMDD-hhmmss>` (UTC),
/// as the kubelet's `ContainerLogManager` names them.
#[must_use]
pub fn rotated_name(log: &Path, now: Timestamp) -> PathBuf {
    let stamp = now.strftime("%Y%m%d-%H%M%S");
    PathBuf::from(format!("{}.{stamp}", log.display()))
}

/// The newest rotated file of the live log `log` that is not compressed: the
/// one rotated last, which the log manager leaves as it is until the next
/// rotation. `None` when there is none or the directory cannot be read.
#[must_use]
pub fn newest_rotated(log: &Path) -> Option<PathBuf> {
    let (dir, file) = (log.parent()?, log.file_name()?);
    let prefix = format!("{}.", file.to_string_lossy());
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with(&prefix) && !n.ends_with(COMPRESSED_SUFFIX) && !n.ends_with(TMP_SUFFIX)
        })
        .max()
        .map(|n| dir.join(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_content_is_the_content_of_the_last_file_lines() {
        let log = b"2024-01-01T00:00:00Z stdout F one\n\
                    2024-01-01T00:00:01Z stderr P tw\n\
                    2024-01-01T00:00:02Z stderr F o\n\
                    2024-01-01T00:00:03Z stdout F three\n";
        let tail = |log: &[u8], lines, max| {
            let got = tail_content(&mut io::Cursor::new(log), lines, max).unwrap();
            String::from_utf8(got.content).unwrap()
        };
        assert_eq!(tail(log, 80, 2048), "one\ntwo\nthree\n");
        // Lines of the file, as the kubelet counts them: a partial line is one.
        assert_eq!(tail(log, 2, 2048), "o\nthree\n");
        assert_eq!(tail(log, 0, 2048), "");
        assert_eq!(tail(log, 80, 4), "ree\n");
        assert_eq!(tail(log, 80, 0), "");
        let unterminated = b"2024-01-01T00:00:00Z stdout P DONE\n";
        assert_eq!(tail(unterminated, 80, 2048), "DONE");
        let no_newline = b"2024-01-01T00:00:00Z stdout F one\n2024-01-01T00:00:00Z stdout F tw";
        // As the kubelet's `ReadLogs`: the line without a newline is read after
        // the counted ones, within the count.
        assert_eq!(tail(no_newline, 1, 2048), "one\n");
        assert_eq!(tail(no_newline, 2, 2048), "one\ntw");
        let json = br#"{"log":"a\n","stream":"stdout","time":"2024-01-01T00:00:00Z"}
{"log":"b\n","stream":"stderr","time":"2024-01-01T00:00:01Z"}
"#;
        assert_eq!(tail(json, 1, 2048), "b\n");
        assert_eq!(tail(b"garbage\n", 80, 2048), "");
        assert_eq!(tail(b"", 80, 2048), "");
    }

    /// A reader that counts the bytes read from it.
    struct Counting<R> {
        inner: R,
        read: u64,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl<R: Seek> Seek for Counting<R> {
        fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    #[test]
    fn tail_content_reads_only_the_end_and_keeps_little() {
        // 100,000 lines: only the last ones are read.
        let line = "2024-01-01T00:00:00Z stdout F 0123456789\n";
        let many = line.repeat(100_000);
        let mut f = Counting {
            inner: io::Cursor::new(many.as_bytes()),
            read: 0,
        };
        let got = tail_content(&mut f, 80, 2048).unwrap();
        assert_eq!(got.content, b"0123456789\n".repeat(80));
        assert_eq!(got.lines, 80);
        let limit = 2 * (80 * line.len() as u64 + TAIL_BLOCK as u64);
        assert!(f.read < limit, "read {} bytes", f.read);
        // One 8 MiB line without a newline: its end, and the header still parsed.
        let mut huge = b"2024-01-01T00:00:00Z stderr P ".to_vec();
        huge.extend(std::iter::repeat_n(b'x', 8 << 20));
        huge.extend_from_slice(b"END");
        let got = tail_content(&mut io::Cursor::new(&huge), 80, 2048).unwrap();
        assert_eq!(got.content.len(), 2048);
        assert!(got.content.ends_with(b"xxEND"));
        assert_eq!(got.lines, 1);
        // Lines longer than what is kept: the bound holds whatever their number.
        let mut line = Vec::new();
        let mut r = io::BufReader::with_capacity(64, io::Cursor::new(&huge));
        assert_eq!(
            read_line_bounded(&mut r, &mut line, 100).unwrap(),
            huge.len() as u64
        );
        assert!(line.len() <= LINE_HEAD + 2 * 100, "{}", line.len());
        assert!(line.starts_with(b"2024-01-01T00:00:00Z stderr P xx"));
        assert!(line.ends_with(b"xxEND"));
    }

    #[test]
    fn tail_finds_line_starts_across_blocks() {
        let line = "a".repeat(TAIL_BLOCK);
        let text = format!(
            "{line}\n{line}\n{line}\n{line}\n{}",
            &line[TAIL_BLOCK / 2..]
        );
        let mut c = io::Cursor::new(text.as_bytes());
        let step = TAIL_BLOCK as u64 + 1;
        assert_eq!(tail_start(&mut c, 0).unwrap(), step * 4);
        assert_eq!(tail_start(&mut c, 1).unwrap(), step * 3);
        assert_eq!(tail_start(&mut c, 9999).unwrap(), 0);
        assert_eq!(tail_start(&mut io::Cursor::new(b""), 3).unwrap(), 0);
    }

    #[test]
    fn cri_lines_parse() {
        let m = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F log content 1\n").unwrap();
        assert_eq!(m.stream, Stream::Stdout);
        assert_eq!(&*m.content, b"log content 1\n");
        assert_eq!(
            m.timestamp,
            "2016-10-06T00:17:09.669794202Z".parse().unwrap()
        );
        // A partial line loses its newline; tags after `:` are ignored.
        let m = parse_cri_line(b"2016-10-06T00:17:09.669794203Z stderr P:x part\n").unwrap();
        assert_eq!((m.stream, &*m.content), (Stream::Stderr, &b"part"[..]));
        // Empty content.
        let m = parse_cri_line(b"2016-10-06T00:17:09Z stdout F \n").unwrap();
        assert_eq!(&*m.content, b"\n");
        // Offsets are kept for output.
        let m = parse_cri_line(b"2016-10-06T02:17:09.5+02:00 stdout F x\n").unwrap();
        assert_eq!(
            format_timestamp(m.timestamp, m.offset),
            "2016-10-06T02:17:09.500000000+02:00"
        );
        for bad in [
            &b"garbage\n"[..],
            b"2016-10-06T00:17:09Z stdin F x\n",
            b"2016-10-06T00:17:09Z stdout\n",
            b"2016-10-06T00:17:09Z stdout F\n",
            b"yesterday stdout F x\n",
        ] {
            assert!(
                parse_cri_line(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn docker_json_lines_parse() {
        let m = parse_json_line(
            br#"{"log":"content 1\n","stream":"stderr","time":"2016-10-20T18:39:20.57606443Z"}"#,
        )
        .unwrap();
        assert_eq!(
            (m.stream, &*m.content),
            (Stream::Stderr, &b"content 1\n"[..])
        );
    }
}

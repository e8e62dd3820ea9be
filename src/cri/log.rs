//! The container log file format of the CRI (`<RFC3339Nano> <stdout|stderr>
//! <F|P>[:tags] <content>`, and Docker's JSON lines), as the runtime writes it
//! and k8s.io/cri-client/pkg/logs reads it: parsing a line, and the kubelet's
//! timestamp format for `timestamps=true`. The node API's log reader and the
//! termination message's log fallback both read logs through it.

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

#[cfg(test)]
mod tests {
    use super::*;

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

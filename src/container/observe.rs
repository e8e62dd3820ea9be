//! Reads one pod's sandboxes and containers from CRI by the
//! `io.kubernetes.pod.uid` label: the kubelet's `GetPodStatus`.

use std::collections::HashMap;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;

use crate::cri::{Result, Runtime};
use crate::labels::{
    CONTAINER_HASH_ANNOTATION, POD_UID_LABEL, TERMINATION_MESSAGE_PATH_ANNOTATION,
    TERMINATION_MESSAGE_POLICY_ANNOTATION,
};
use crate::pod_core::runtime::{Container, ContainerState, PodRuntime, Sandbox};

fn ts(nanos: i64) -> Option<Timestamp> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
}

/// Converts a CRI sandbox status into [`Sandbox`].
#[must_use]
pub fn sandbox_from(s: &cri::PodSandboxStatus) -> Sandbox {
    let mut ips: Vec<String> = Vec::new();
    if let Some(n) = &s.network {
        if !n.ip.is_empty() {
            ips.push(n.ip.clone());
        }
        ips.extend(n.additional_ips.iter().map(|p| p.ip.clone()));
    }
    Sandbox {
        id: s.id.clone(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        ready: s.state == cri::PodSandboxState::SandboxReady as i32,
        created_at: ts(s.created_at).unwrap_or_default(),
        ips,
    }
}

/// Most bytes of a termination message file that are reported (the kubelet's
/// `MaxContainerTerminationMessageLength`, 4 KiB): the file's last ones.
pub const MAX_TERMINATION_MESSAGE_BYTES: usize = 4 * 1024;
/// Most log lines and bytes used as a termination message under
/// `FallbackToLogsOnError` (the kubelet's `MaxContainerTerminationMessageLogLines`,
/// 80, and `MaxContainerTerminationMessageLogLength`, 2 KiB).
pub const MAX_TERMINATION_LOG_LINES: usize = 80;
/// See [`MAX_TERMINATION_LOG_LINES`].
pub const MAX_TERMINATION_LOG_BYTES: usize = 2 * 1024;

/// `bytes` as text of at most `max` bytes: invalid UTF-8 replaced, and, should
/// the replacements make it longer, whole characters dropped from the front.
fn bounded_text(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let Some(excess) = text.len().checked_sub(max).filter(|e| *e > 0) else {
        return text.into_owned();
    };
    text[text.ceil_char_boundary(excess)..].to_string()
}

/// The last `max` bytes of the regular file at `path` (the kubelet's
/// `tail.ReadAtMost`): one seek and one bounded read whatever its size. Anything
/// but a regular file (a FIFO, a device planted at the path) reads as empty,
/// without blocking.
///
/// # Errors
/// The file cannot be opened, inspected or read.
pub fn read_at_most(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Ok(Vec::new());
    }
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    let start = meta.len().saturating_sub(max);
    f.seek(SeekFrom::Start(start))?;
    let mut data = Vec::new();
    f.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// Where an exited container's termination message is read from: the host
/// side of the file mounted at its `terminationMessagePath`, and its log when
/// the policy is `FallbackToLogsOnError` and the container failed (not when it
/// could not even run: it has no log). Pure: taken from the CRI status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TerminationSource {
    /// The host path of the termination message file, if one is mounted.
    pub file: Option<PathBuf>,
    /// The container's log, when the message falls back to it.
    pub fallback_log: Option<PathBuf>,
}

impl TerminationSource {
    /// The sources of `s`'s termination message, as the kubelet's
    /// `convertToKubeContainerStatus` picks them.
    #[must_use]
    pub fn of(s: &cri::ContainerStatus) -> Self {
        let path = s
            .annotations
            .get(TERMINATION_MESSAGE_PATH_ANNOTATION)
            .filter(|p| !p.is_empty());
        let fallback = s
            .annotations
            .get(TERMINATION_MESSAGE_POLICY_ANNOTATION)
            .map(String::as_str)
            == Some("FallbackToLogsOnError")
            && s.exit_code != 0
            && s.reason != "ContainerCannotRun";
        Self {
            file: path
                .and_then(|p| s.mounts.iter().find(|m| &m.container_path == p))
                .map(|m| PathBuf::from(&m.host_path)),
            fallback_log: (fallback && !s.log_path.is_empty()).then(|| PathBuf::from(&s.log_path)),
        }
    }

    /// The termination message, as the kubelet's `getTerminationMessage` and
    /// `readLastStringFromContainerLogs`: the last
    /// [`MAX_TERMINATION_MESSAGE_BYTES`] of the file; when there is no file or
    /// it is empty, and the policy falls back, the last
    /// [`MAX_TERMINATION_LOG_BYTES`] of the last [`MAX_TERMINATION_LOG_LINES`]
    /// lines of the log. A file that cannot be read gives the kubelet's error
    /// message instead (and no fallback). Reads at most those bytes from the end
    /// of each file (seeks, never reads a file whole); blocking: call it off the
    /// async threads, as [`observe`] does.
    #[must_use]
    pub fn read(&self) -> String {
        let from_file = match &self.file {
            None => String::new(),
            Some(path) => match read_at_most(path, MAX_TERMINATION_MESSAGE_BYTES) {
                Ok(data) => bounded_text(&data, MAX_TERMINATION_MESSAGE_BYTES),
                Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
                Err(e) => {
                    return format!("Error on reading termination log {}: {e}", path.display());
                }
            },
        };
        let Some(log) = self.fallback_log.as_ref().filter(|_| from_file.is_empty()) else {
            return from_file;
        };
        match log_tail(log) {
            Ok(data) => bounded_text(&data, MAX_TERMINATION_LOG_BYTES),
            Err(e) => format!("Error on reading termination message from logs: {e}"),
        }
    }
}

/// The last [`MAX_TERMINATION_LOG_LINES`] lines of the container log `log`,
/// at most their last [`MAX_TERMINATION_LOG_BYTES`]: the kubelet's
/// `readLastStringFromContainerLogs`, with one difference. When the live log
/// holds fewer lines because the log manager rotated it (the rotated files of
/// a log are the same container's earlier output: a restart writes a new
/// log), the rest is read from the end of the newest rotated file, so the
/// message is the container's last lines however the rotation fell, even
/// when it left the live log empty or, for a moment, absent. The kubelet
/// reads the live log alone. The error is the kubelet's text.
fn log_tail(log: &Path) -> std::result::Result<Vec<u8>, String> {
    use crate::cri::log::{Tail, newest_rotated, tail_content};
    let lines = MAX_TERMINATION_LOG_LINES as u64;
    let shown = || log.display().to_string();
    let rotated = newest_rotated(log);
    let live = match std::fs::File::open(log) {
        Ok(mut f) => tail_content(&mut f, lines, MAX_TERMINATION_LOG_BYTES)
            .map_err(|e| format!("failed to read log file {:?}: {e}", shown()))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound && rotated.is_some() => Tail::default(),
        Err(e) => return Err(format!("failed to open log file {:?}: {e}", shown())),
    };
    let room = MAX_TERMINATION_LOG_BYTES.saturating_sub(live.content.len());
    if live.lines >= lines || room == 0 {
        return Ok(live.content);
    }
    let Some(older) = rotated else {
        return Ok(live.content);
    };
    let mut out = std::fs::File::open(&older)
        .and_then(|mut f| tail_content(&mut f, lines - live.lines, room))
        .map_or_else(|_| Vec::new(), |t| t.content);
    out.extend_from_slice(&live.content);
    Ok(out)
}

/// The termination message of an exited container with status `s`, read on a
/// blocking thread (see [`TerminationSource::read`]); empty for any other.
async fn termination_message(s: &cri::ContainerStatus) -> String {
    if s.state != cri::ContainerState::ContainerExited as i32 {
        return String::new();
    }
    let source = TerminationSource::of(s);
    if source == TerminationSource::default() {
        return String::new();
    }
    tokio::task::spawn_blocking(move || source.read())
        .await
        .unwrap_or_default()
}

/// Converts a CRI container status into [`Container`]; `written` is the
/// termination message of an exited container (from [`TerminationSource`]),
/// appended to the runtime's message.
#[must_use]
pub fn container_from(s: &cri::ContainerStatus, sandbox_id: &str, written: &str) -> Container {
    let state = match cri::ContainerState::try_from(s.state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    Container {
        id: s.id.clone(),
        name: s
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        sandbox_id: sandbox_id.to_string(),
        state,
        created_at: ts(s.created_at).unwrap_or_default(),
        started_at: ts(s.started_at),
        finished_at: ts(s.finished_at),
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: if state == ContainerState::Exited {
            match (s.message.is_empty(), written.is_empty()) {
                (_, true) => s.message.clone(),
                (true, false) => written.to_string(),
                (false, false) => format!("{}: {written}", s.message),
            }
        } else {
            s.message.clone()
        },
        image: s
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        image_ref: s.image_ref.clone(),
        hash: s
            .annotations
            .get(CONTAINER_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        memory_request: s
            .annotations
            .get(crate::labels::MEMORY_REQUEST_ANNOTATION)
            .and_then(|v| v.parse().ok()),
        backoff_since: s
            .annotations
            .get(crate::labels::BACKOFF_SINCE_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        resources: s
            .resources
            .as_ref()
            .and_then(|r| r.linux.as_ref())
            .map(|l| crate::pod_core::runtime::CgroupLimits {
                cpu_shares: l.cpu_shares,
                cpu_quota: l.cpu_quota,
                cpu_period: l.cpu_period,
                memory_limit_in_bytes: l.memory_limit_in_bytes,
            }),
    }
}

/// Everything the runtime holds for the pod with `uid`: one ListPodSandbox, one
/// ListContainers, then a status call for each ready sandbox (its IPs) and each container.
///
/// # Errors
/// The first CRI call that fails.
pub async fn observe(runtime: &Runtime, uid: &str) -> Result<PodRuntime> {
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    let (sandboxes, containers) = tokio::try_join!(
        runtime.list_pod_sandboxes(by_uid.clone()),
        runtime.list_containers(by_uid)
    )?;
    let sandbox_futs = sandboxes.iter().map(|s| async move {
        if s.state == cri::PodSandboxState::SandboxReady as i32
            && let Some(st) = runtime.pod_sandbox_status(&s.id).await?
        {
            return Ok(sandbox_from(&st));
        }
        Ok(Sandbox {
            id: s.id.clone(),
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state == cri::PodSandboxState::SandboxReady as i32,
            created_at: ts(s.created_at).unwrap_or_default(),
            ips: vec![],
        })
    });
    let container_futs = containers.iter().map(|c| async move {
        let Some(st) = runtime.container_status(&c.id).await? else {
            return Ok::<_, crate::cri::Error>(None);
        };
        let written = termination_message(&st).await;
        Ok(Some(container_from(&st, &c.pod_sandbox_id, &written)))
    });
    let (sandboxes, containers) = tokio::try_join!(
        futures::future::try_join_all(sandbox_futs),
        futures::future::try_join_all(container_futs)
    )?;
    let mut rt = PodRuntime {
        sandboxes,
        containers: containers.into_iter().flatten().collect(),
    };
    rt.sort();
    Ok(rt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(dir: &Path, policy: &str, exit_code: i32) -> cri::ContainerStatus {
        cri::ContainerStatus {
            state: cri::ContainerState::ContainerExited as i32,
            exit_code,
            log_path: dir.join("0.log").to_string_lossy().into_owned(),
            annotations: [
                (
                    TERMINATION_MESSAGE_PATH_ANNOTATION.to_string(),
                    "/dev/termination-log".to_string(),
                ),
                (
                    TERMINATION_MESSAGE_POLICY_ANNOTATION.to_string(),
                    policy.to_string(),
                ),
            ]
            .into(),
            mounts: vec![cri::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: dir.join("msg").to_string_lossy().into_owned(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn message(st: &cri::ContainerStatus) -> String {
        TerminationSource::of(st).read()
    }

    #[test]
    fn termination_message_from_file_or_logs() {
        let dir = tempfile::tempdir().unwrap();
        let (file, log) = (dir.path().join("msg"), dir.path().join("0.log"));
        std::fs::write(&log, "2024-01-01T00:00:00Z stderr F boom\n").unwrap();
        let mut st = exited(dir.path(), "FallbackToLogsOnError", 1);
        assert_eq!(message(&st), "boom\n", "no file: fall back to the log");
        std::fs::write(&file, "written by the app").unwrap();
        assert_eq!(message(&st), "written by the app");
        std::fs::write(&file, "").unwrap();
        assert_eq!(message(&st), "boom\n", "empty file: fall back to the log");
        st.reason = "ContainerCannotRun".into();
        assert_eq!(message(&st), "", "it never ran: no log to fall back to");
        st.reason = String::new();
        st.exit_code = 0;
        assert_eq!(message(&st), "", "exit 0: no fallback");
        let st = exited(dir.path(), "File", 1);
        assert_eq!(message(&st), "", "policy File: no fallback");
        std::fs::remove_file(&log).unwrap();
        let st = exited(dir.path(), "FallbackToLogsOnError", 1);
        assert!(
            message(&st).starts_with("Error on reading termination message from logs: "),
            "{}",
            message(&st)
        );
    }

    #[test]
    fn a_huge_termination_message_file_gives_its_last_4_kib() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("msg");
        // 400 MiB (sparse: no disk used) and a marker at the end.
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(400 << 20).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"THE-END"))
            .unwrap();
        let got = message(&exited(dir.path(), "File", 0));
        assert_eq!(got.len(), MAX_TERMINATION_MESSAGE_BYTES);
        assert!(got.ends_with("\0\0THE-END"));
    }

    #[test]
    fn a_huge_log_gives_the_last_2_kib_of_its_last_80_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = String::new();
        // The runtime's 16 KiB pieces of one long line, then two short ones.
        for _ in 0..200 {
            log.push_str("2024-01-01T00:00:00.000000000Z stdout P ");
            log.push_str(&"a".repeat(16 * 1024));
            log.push('\n');
        }
        log.push_str("2024-01-01T00:00:01Z stdout F \n2024-01-01T00:00:01Z stderr F the end\n");
        std::fs::write(dir.path().join("0.log"), &log).unwrap();
        let got = message(&exited(dir.path(), "FallbackToLogsOnError", 3));
        assert_eq!(got.len(), MAX_TERMINATION_LOG_BYTES);
        assert!(got.ends_with("aaa\nthe end\n"), "{got:?}");
    }

    #[test]
    fn a_log_rotated_as_the_container_ended_still_gives_its_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("0.log");
        let line = |i: usize| format!("2024-01-01T00:00:00Z stdout F line {i}\n");
        let older: String = (0..100).map(line).collect();
        // An older rotation, compressed, must not be read.
        std::fs::write(dir.path().join("0.log.20240101-000000.gz"), "not a log").unwrap();
        std::fs::write(dir.path().join("0.log.20240101-000010"), &older).unwrap();
        let st = exited(dir.path(), "FallbackToLogsOnError", 3);
        // Rotated and reopened, then the container exited without writing.
        std::fs::write(&live, "").unwrap();
        let got = message(&st);
        assert!(
            got.starts_with("line 20\n") && got.ends_with("line 99\n"),
            "{got:?}"
        );
        assert_eq!(got.lines().count(), 80);
        // Renamed, not yet reopened: the live log is absent for a moment.
        std::fs::remove_file(&live).unwrap();
        assert_eq!(message(&st), got);
        // Two lines after the rotation: 78 come from the rotated file.
        std::fs::write(&live, format!("{}{}", line(100), line(101))).unwrap();
        let got = message(&st);
        assert!(
            got.starts_with("line 22\n") && got.ends_with("line 101\n"),
            "{got:?}"
        );
        assert_eq!(got.lines().count(), 80);
        // A live log of 80 lines or more is read alone.
        let full: String = (200..300).map(line).collect();
        std::fs::write(&live, full).unwrap();
        assert!(message(&st).starts_with("line 220\n"));
    }

    #[test]
    fn what_is_not_a_regular_file_reads_as_empty_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("msg");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(message(&exited(dir.path(), "File", 1)), "");
    }

    #[test]
    fn invalid_utf8_never_makes_a_message_longer_than_its_bound() {
        let text = bounded_text(&[0xff; 4096], 4096);
        assert!(text.len() <= 4096, "{}", text.len());
        assert!(text.chars().all(|c| c == char::REPLACEMENT_CHARACTER));
        assert_eq!(bounded_text(b"plain", 4096), "plain");
        // A character cut at the front by the tail read is replaced, not kept whole.
        assert_eq!(
            bounded_text("é!".as_bytes().get(1..).unwrap(), 8),
            "\u{fffd}!"
        );
    }

    #[tokio::test]
    async fn only_exited_containers_read_a_message() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("msg"), "bye").unwrap();
        let mut st = exited(dir.path(), "File", 0);
        assert_eq!(termination_message(&st).await, "bye");
        let c = container_from(&st, "s", "bye");
        assert_eq!(c.message, "bye");
        st.message = "runtime says".into();
        assert_eq!(container_from(&st, "s", "bye").message, "runtime says: bye");
        st.state = cri::ContainerState::ContainerRunning as i32;
        assert_eq!(termination_message(&st).await, "");
    }

    /// The back-off mark is read as written; anything else (not a number,
    /// negative, beyond u32, megabytes) reads as 0, the longest back-off.
    #[test]
    fn a_hostile_back_off_mark_reads_as_zero() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = exited(dir.path(), "File", 1);
        let mark = |st: &mut cri::ContainerStatus, v: String| {
            st.annotations
                .insert(crate::labels::BACKOFF_SINCE_ANNOTATION.to_string(), v);
            container_from(st, "s", "").backoff_since
        };
        assert_eq!(mark(&mut st, "7".into()), 7);
        for bad in ["-1", "x", "4294967296", "", "1e3"] {
            assert_eq!(mark(&mut st, bad.into()), 0, "{bad:?}");
        }
        assert_eq!(mark(&mut st, "9".repeat(1 << 20)), 0);
    }
}
